"""Paired tests over test examples, from the predictions two methods saved (`save.predictions=true`).

Both runs of a seed predict the same official dev rows (predictions.csv: `index, label, prediction`; any further
columns, e.g. logits, are ignored here). Over the data seeds both methods have predictions for:

- a paired bootstrap on the task's own metric (MCC for CoLA, F1 for MRPC/QQP, Spearman for STS-B, accuracy
  otherwise): each replicate resamples the examples with replacement, the same indices for both methods (paired) and
  for every seed when all seeds predict the same rows (an example takes its results of every seed with it; seeds with
  different examples draw their own), scores each seed by the metric and averages method − reference over the seeds.
  The 95% interval is the replicates' 2.5th and 97.5th percentiles; p = min(1, 2 × the smaller share of replicates
  ≤ 0 or ≥ 0), two-sided. With B replicates the smallest p above 0 is 2/B (one replicate across 0, doubled), so a
  p of 0 reads p < 2/B. Assumes the examples are exchangeable draws of the task's inputs; the trained models (seeds)
  are fixed, so it tests these runs, not a new seed's;
- for accuracy tasks only, McNemar's test stratified by seed (stratified_mcnemar below): both runs of a seed answer
  the same examples, so the paired datum is the discordant pair: per seed s, b_s examples only the method got right
  and c_s only the reference. Under no difference each discordant pair is as likely to go either way, so given the
  b_s + c_s the b_s are binomial(b_s + c_s, 1/2) and their sum B (C = Σ c_s) binomial(B + C, 1/2). With 25 or more
  discordant pairs (the usual rule of thumb for the chi² approximation): the asymptotic test, (B − C)² / (B + C)
  against chi² with 1 degree of freedom, no continuity correction; with fewer: the mid-p binomial test. Fagerland,
  Lydersen & Laake (2013, BMC Med. Res. Methodol. 13:91) found the exact conditional test conservative and these
  two holding their size. It counts right answers, so it tests accuracy, never MCC or F1. It treats the strata as
  independent; the seeds answer the same dev rows, so an example that favours one method in one seed may in others
  too, and then it is optimistic: read it beside the bootstrap, which resamples an example with all its seeds.
"""
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import binom, chi2, rankdata

PREDICTIONS = "predictions.csv"  # saving.PREDICTIONS: beside result.json
REPLICATES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0  # the replicates are drawn from this seed, so a render is reproducible
ASYMPTOTIC_FROM = 25  # discordant pairs from which McNemar's chi² approximation is used; below it the mid-p test


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
    observed difference. A p of 0 means no replicate crossed 0: p < 2 / replicates (the smallest p above 0 is one replicate
    across, doubled), not 0.
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


def discordant(labels, ours, theirs):
    """(b, c) of one seed: the examples only the method answered right, and only the reference."""
    return int(np.sum((ours == labels) & (theirs != labels))), int(np.sum((ours != labels) & (theirs == labels)))


def stratified_mcnemar(pairs):
    """McNemar's test of accuracy stratified by seed: {only_method, only_reference, per_seed, test, statistic, p_value}.

    Per seed s, b_s and c_s are the discordant examples (only the method right, only the reference right); B and C
    their sums. Given the b_s + c_s, under no difference B is binomial(B + C, 1/2): with B + C >= ASYMPTOTIC_FROM
    the asymptotic test, X² = (B − C)² / (B + C), chi² with 1 degree of freedom, no continuity correction ("chi2");
    below it the mid-p binomial test, 2 × (P(X ≤ min) − P(X = min) / 2) for X ~ binomial(B + C, 1/2) ("mid-p", no
    statistic). No discordant pair: p = 1 (test "none"). `per_seed`: "b/c" per seed, as the strata were counted."""
    counts = [discordant(*pair) for pair in pairs]
    only_ours, only_theirs = sum(b for b, _ in counts), sum(c for _, c in counts)
    total = only_ours + only_theirs
    result = {"only_method": only_ours, "only_reference": only_theirs,
              "per_seed": " ".join(f"{b}/{c}" for b, c in counts)}
    if total == 0:
        return {**result, "test": "none", "statistic": np.nan, "p_value": 1.0}
    if total >= ASYMPTOTIC_FROM:
        statistic = (only_ours - only_theirs) ** 2 / total
        return {**result, "test": "chi2", "statistic": float(statistic), "p_value": float(chi2.sf(statistic, 1))}
    smaller = min(only_ours, only_theirs)
    mid_p = 2 * (binom.cdf(smaller, total, 0.5) - binom.pmf(smaller, total, 0.5) / 2)
    return {**result, "test": "mid-p", "statistic": np.nan, "p_value": float(min(1.0, mid_p))}


def example_tests(ours, theirs, metric, regression):
    """The bootstrap and (accuracy tasks) stratified McNemar for two runs' seeds: `ours` and `theirs` map seed -> record path.

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
        result.update({f"mcnemar_{key}": value for key, value in stratified_mcnemar(pairs).items()})
    return result
