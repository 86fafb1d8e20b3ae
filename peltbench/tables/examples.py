"""Paired tests over test examples, from the predictions two methods saved (`save.predictions=true`).

Both runs of a seed predict the same official dev rows (predictions.csv: `index, label, prediction`; any further
columns, e.g. logits, are ignored here). Pooled over the data seeds both methods have predictions for:

- a paired bootstrap: each replicate draws the test examples with replacement (the same draw for every seed and
  both methods), scores both methods on it by the task's main metric, and averages the difference over the seeds;
  the 95% interval is the replicates' 2.5th and 97.5th percentiles, the p-value twice the smaller tail share of
  replicates on either side of 0 (at most 1);
- McNemar's exact test (classification): over every (seed, example) pair, b = only the method right, c = only the
  reference right, p = the two-sided binomial test of b successes in b + c trials at 1/2 (scipy.stats.binomtest).
  An example counts once per seed, so pooled pairs are not independent across seeds: the test treats them as if.
"""
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import binomtest, spearmanr, pearsonr

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
    function = {"spearman": spearmanr, "pearson": pearsonr}[metric]
    return np.array([100.0 * function(predictions[row], labels[row])[0] for row in draws])


def paired_bootstrap(metric, pairs, replicates=REPLICATES, seed=BOOTSTRAP_SEED, confidence=CONFIDENCE):
    """`pairs`: [(labels, method's predictions, reference's predictions)] per seed, over the same examples.

    Returns {difference, ci_low, ci_high, p_value, replicates}: the observed mean over seeds of method − reference,
    and the bootstrap's interval and two-sided p-value.
    """
    size = len(pairs[0][0])
    everything = np.arange(size)[None, :]
    observed = np.mean([replicate_scores(metric, labels, ours, everything)[0]
                        - replicate_scores(metric, labels, theirs, everything)[0] for labels, ours, theirs in pairs])
    draws = np.random.default_rng(seed).integers(0, size, size=(replicates, size))
    differences = np.mean([replicate_scores(metric, labels, ours, draws) - replicate_scores(metric, labels, theirs, draws)
                           for labels, ours, theirs in pairs], axis=0)
    tail = (1 - confidence) / 2
    low, high = np.quantile(differences, [tail, 1 - tail])
    p_value = min(1.0, 2 * min(np.mean(differences <= 0), np.mean(differences >= 0)))
    return {"difference": float(observed), "ci_low": float(low), "ci_high": float(high), "p_value": float(p_value),
            "replicates": replicates}


def mcnemar(pairs):
    """McNemar's exact test over (seed, example) pairs: {only_method, only_reference, p_value}."""
    only_ours = sum(int(np.sum((ours == labels) & (theirs != labels))) for labels, ours, theirs in pairs)
    only_theirs = sum(int(np.sum((ours != labels) & (theirs == labels))) for labels, ours, theirs in pairs)
    discordant = only_ours + only_theirs
    p_value = binomtest(only_ours, discordant, 0.5).pvalue if discordant else 1.0
    return {"only_method": only_ours, "only_reference": only_theirs, "p_value": float(p_value)}


def example_tests(ours, theirs, metric, regression):
    """The bootstrap and (classification) McNemar for two runs' seeds: `ours` and `theirs` map seed -> record path.

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
    result = {"prediction_seeds": " ".join(map(str, seeds)), "examples": len(pairs[0][0])}
    boot = paired_bootstrap(metric, pairs)
    result.update({f"bootstrap_{key}": value for key, value in boot.items()})
    if not regression:
        result.update({f"mcnemar_{key}": value for key, value in mcnemar(pairs).items()})
    return result
