"""Paired tests over test examples, from the predictions two methods saved (`save.predictions=true`).

Both runs of a seed predict the same official dev rows (predictions.csv: `index, label, prediction`; any further
columns, e.g. logits, are ignored here). Over the data seeds both methods have predictions for:

- a paired bootstrap on the task's own metric (MCC for CoLA, F1 for MRPC/QQP, Spearman for STS-B, accuracy
  otherwise): each replicate resamples the examples with replacement, the same indices for both methods (paired) and
  for every seed when all seeds predict the same rows (an example takes its results of every seed with it; seeds with
  different examples draw their own), scores each seed by the metric and averages method − reference over the seeds.
  The 95% interval is the replicates' 2.5th and 97.5th percentiles; p = min(1, 2 × the smaller share of replicates
  ≤ 0 or ≥ 0), two-sided. With B replicates a p of 0 reads p < 1/B. Assumes the examples are exchangeable draws of
  the task's inputs; the trained models (seeds) are fixed, so it tests these runs, not a new seed's;
- for accuracy tasks only, the Cochran-Mantel-Haenszel test with the seeds as strata (cmh below): per seed, method
  vs. reference × right vs. wrong, continuity-corrected, chi² with 1 degree of freedom. It counts right answers, so it
  tests accuracy, never MCC or F1. It treats each seed's examples as independent and the seeds as independent strata
  (they predict the same dev rows, so they are not: read it beside the bootstrap), and within a seed it does not use
  which example a right answer was on (conservative when both methods get the same examples right).
"""
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import chi2, rankdata

PREDICTIONS = "predictions.csv"  # saving.PREDICTIONS: beside result.json
REPLICATES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0  # the replicates are drawn from this seed, so a render is reproducible


def read_predictions(record_path):
    """(labels, predictions) of the run whose result.json is `record_path`, or None when it saved none."""
    path = Path(record_path).parent / PREDICTIONS
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path).sort_values("index")
        return frame["label"].to_numpy(), frame["prediction"].to_numpy()
    except (OSError, ValueError, KeyError, pd.errors.ParserError):
        return None


def _counts(labels, predictions, draws):
    """Per replicate (rows of `draws`, example indices): tp, fp, fn, tn of the positive class 1."""
    label, predicted = labels[draws] == 1, predictions[draws] == 1
    return [np.sum(a & b, axis=1).astype(float) for a, b in
            ((label, predicted), (~label, predicted), (label, ~predicted), (~label, ~predicted))]


def replicate_scores(metric, labels, predictions, draws):
    """The main metric ×100 of each replicate (rows of `draws`); vectorised where the metric allows."""
    if metric == "accuracy":
        return 100.0 * np.mean(labels[draws] == predictions[draws], axis=1)
    if metric in ("f1", "mcc"):
        tp, fp, fn, tn = _counts(labels, predictions, draws)
        with np.errstate(divide="ignore", invalid="ignore"):
            if metric == "f1":
                return 100.0 * np.where(tp > 0, 2 * tp / (2 * tp + fp + fn), 0.0)
            denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
            return 100.0 * np.where(denominator > 0, (tp * tn - fp * fn) / np.where(denominator > 0, denominator, 1), 0.0)
    if metric not in ("spearman", "pearson"):
        raise ValueError(f"no bootstrap for the metric {metric!r}")
    x, y = predictions[draws].astype(float), labels[draws].astype(float)
    if metric == "spearman":  # Spearman: Pearson of the (average-tie) ranks, as scipy.stats.spearmanr
        x, y = rankdata(x, axis=1), rankdata(y, axis=1)
    x, y = x - x.mean(axis=1, keepdims=True), y - y.mean(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):  # a constant resample has no correlation: NaN, as scipy's
        return 100.0 * np.sum(x * y, axis=1) / np.sqrt(np.sum(x * x, axis=1) * np.sum(y * y, axis=1))


def _draws(pairs, replicates, seed):
    """Example indices per seed, one row per replicate, from one generator seeded `seed`.

    When every seed predicts the same examples (the official dev rows: same labels, same order) one draw serves every
    seed, so an example carries its results of all the seeds with it; otherwise each seed draws its own examples."""
    rng = np.random.default_rng(seed)
    if all(len(labels) == len(pairs[0][0]) and np.array_equal(labels, pairs[0][0]) for labels, _, _ in pairs):
        draws = rng.integers(0, len(pairs[0][0]), size=(replicates, len(pairs[0][0])))
        return [draws] * len(pairs)
    return [rng.integers(0, len(labels), size=(replicates, len(labels))) for labels, _, _ in pairs]


def paired_bootstrap(metric, pairs, replicates=REPLICATES, seed=BOOTSTRAP_SEED, confidence=CONFIDENCE):
    """`pairs`: [(labels, method's predictions, reference's predictions)] per seed, each over one seed's examples.

    Each replicate resamples the examples with replacement (both methods on the same indices: paired), scores each
    seed's resample by the task's metric, and averages method − reference over the seeds. Returns {difference,
    ci_low, ci_high, p_value, replicates}: the observed mean difference, the replicates' percentile interval and
    p = min(1, 2 × the smaller share of replicates ≤ 0 or ≥ 0): twice the share on the far side of 0 from the
    observed difference. A p of 0 means no replicate crossed 0: p < 1 / replicates, not 0.
    """
    observed = np.mean([replicate_scores(metric, labels, ours, np.arange(len(labels))[None, :])[0]
                        - replicate_scores(metric, labels, theirs, np.arange(len(labels))[None, :])[0]
                        for labels, ours, theirs in pairs])
    differences = np.mean([replicate_scores(metric, labels, ours, draws) - replicate_scores(metric, labels, theirs, draws)
                           for (labels, ours, theirs), draws in zip(pairs, _draws(pairs, replicates, seed))], axis=0)
    tail = (1 - confidence) / 2
    low, high = np.quantile(differences, [tail, 1 - tail])
    p_value = min(1.0, 2 * min(np.mean(differences <= 0), np.mean(differences >= 0)))
    return {"difference": float(observed), "ci_low": float(low), "ci_high": float(high), "p_value": float(p_value),
            "replicates": replicates}


def cmh(pairs):
    """Cochran-Mantel-Haenszel test of accuracy, strata = seeds: {only_method, only_reference, statistic, p_value}.

    Stratum s is the 2 × 2 table method/reference × right/wrong over its n_s examples (a_s: the method's right
    answers, m_s: both methods' right answers, N_s = 2 n_s). X² = (|Σ(a_s − m_s/2)| − 1/2)² / Σ n_s² m_s (N_s − m_s)
    / (N_s² (N_s − 1)), continuity-corrected, p from chi² with 1 degree of freedom. only_method / only_reference:
    the discordant (seed, example) pairs, b and c, shown beside it (Σ(a_s − m_s/2) = (b − c)/2)."""
    only_ours = sum(int(np.sum((ours == labels) & (theirs != labels))) for labels, ours, theirs in pairs)
    only_theirs = sum(int(np.sum((ours != labels) & (theirs == labels))) for labels, ours, theirs in pairs)
    excess = variance = 0.0
    for labels, ours, theirs in pairs:
        n = len(labels)
        a, right = float(np.sum(ours == labels)), float(np.sum(ours == labels) + np.sum(theirs == labels))
        excess += a - right / 2
        variance += n * n * right * (2 * n - right) / ((2 * n) ** 2 * (2 * n - 1)) if n > 0 else 0.0
    if variance <= 0:
        return {"only_method": only_ours, "only_reference": only_theirs, "statistic": 0.0, "p_value": 1.0}
    statistic = max(abs(excess) - 0.5, 0.0) ** 2 / variance
    return {"only_method": only_ours, "only_reference": only_theirs, "statistic": float(statistic),
            "p_value": float(chi2.sf(statistic, 1))}


def example_tests(ours, theirs, metric, regression):
    """The bootstrap and (accuracy tasks) CMH for two runs' seeds: `ours` and `theirs` map seed -> record path.

    Returns {} when no shared seed has predictions on both sides (or they cover different examples)."""
    pairs, seeds = [], []
    for seed in sorted(set(ours) & set(theirs)):
        mine, other = read_predictions(ours[seed]), read_predictions(theirs[seed])
        if mine is None or other is None or len(mine[0]) != len(other[0]) or not np.array_equal(mine[0], other[0]):
            continue
        pairs.append((mine[0], mine[1], other[1]))
        seeds.append(seed)
    if not pairs:
        return {}
    result = {"prediction_seeds": " ".join(map(str, seeds)), "examples": len(pairs[0][0]), "bootstrap_metric": metric}
    boot = paired_bootstrap(metric, pairs)
    result.update({f"bootstrap_{key}": value for key, value in boot.items()})
    if metric == "accuracy" and not regression:  # a count of right answers tests accuracy only, not MCC or F1
        result.update({f"cmh_{key}": value for key, value in cmh(pairs).items()})
    return result
