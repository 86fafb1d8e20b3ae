"""The metrics a task names (peltbench.tasks.METRICS), computed directly with scikit-learn and SciPy.

GLUE's are the definitions of the Hub's `evaluate.load("glue", ...)` (which downloads a script at run
time and so fails offline): CoLA Matthews correlation; MRPC/QQP F1 of the positive class and accuracy;
STS-B Spearman and Pearson; the rest accuracy. A task of the user's own may also name macro F1 (the
unweighted mean of every class's F1). Scores are ×100; an undefined score (e.g. the correlation of a
constant prediction) is None, never NaN.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.stats import ConstantInputWarning, pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef


def _accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float((predictions == labels).mean())


def _f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(f1_score(labels, predictions, zero_division=0.0))


def _f1_macro(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(f1_score(labels, predictions, average="macro", zero_division=0.0))


def _mcc(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(matthews_corrcoef(labels, predictions))


def _correlation(function):
    def score(predictions: np.ndarray, labels: np.ndarray) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConstantInputWarning)
            return float(function(predictions, labels)[0])
    return score


METRICS = {
    "accuracy": _accuracy,
    "f1": _f1,
    "f1_macro": _f1_macro,
    "mcc": _mcc,
    "pearson": _correlation(pearsonr),
    "spearman": _correlation(spearmanr),
}


def compute_metrics(names, main: str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    """Every named metric ×100 (None where undefined), plus `main`, the one early stopping and Table 1 use."""
    scores: dict[str, float | None] = {}
    for name in names:
        value = 100.0 * METRICS[name](predictions, labels)
        scores[name] = None if math.isnan(value) else value
    scores["main"] = scores[main]
    return scores


def majority_score(main: str, labels: np.ndarray) -> float | None:
    """The main metric of always answering the most frequent label (the smallest id on a tie): the score a model
    that learnt nothing but the label prior reaches on these labels, e.g. accuracy 50.92 on SST-2's 872 test rows
    (444 positive). None for a regression task, whose main metric (a correlation) is undefined for a constant."""
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        return None
    constant = np.full_like(labels, np.bincount(labels).argmax())
    return compute_metrics([main], main, constant, labels)[main]
