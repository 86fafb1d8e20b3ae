"""The GLUE metrics equal scikit-learn / SciPy (×100), and undefined scores are None."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from peltbench.metrics import compute_metrics

rng = np.random.default_rng(0)
LABELS = rng.integers(0, 2, 200)
PREDICTIONS = np.where(rng.random(200) < 0.8, LABELS, 1 - LABELS)
SCORES = rng.uniform(0, 5, 200)
REGRESSION = SCORES + rng.normal(0, 1, 200)


def test_classification_metrics():
    scores = compute_metrics(["f1", "accuracy", "mcc"], "f1", PREDICTIONS, LABELS)
    assert scores["f1"] == pytest.approx(100 * f1_score(LABELS, PREDICTIONS))
    assert scores["accuracy"] == pytest.approx(100 * accuracy_score(LABELS, PREDICTIONS))
    assert scores["mcc"] == pytest.approx(100 * matthews_corrcoef(LABELS, PREDICTIONS))
    assert scores["main"] == scores["f1"]


def test_regression_metrics():
    scores = compute_metrics(["spearman", "pearson"], "spearman", REGRESSION, SCORES)
    assert scores["spearman"] == pytest.approx(100 * spearmanr(REGRESSION, SCORES)[0])
    assert scores["pearson"] == pytest.approx(100 * pearsonr(REGRESSION, SCORES)[0])
    assert scores["main"] == scores["spearman"]


def test_constant_predictions():
    """Constant predictions: MCC 0 (scikit-learn), correlations undefined → None, never NaN."""
    assert compute_metrics(["mcc"], "mcc", np.zeros(10, dtype=int), LABELS[:10])["mcc"] == 0.0
    scores = compute_metrics(["spearman", "pearson"], "spearman", np.ones(10), SCORES[:10])
    assert scores == {"spearman": None, "pearson": None, "main": None}


def test_the_majority_class_score_is_the_main_metric_of_always_answering_it():
    from peltbench.metrics import majority_score

    labels = np.array([1, 1, 0, 1])                          # majority 1: 3 of 4
    assert majority_score("accuracy", labels) == pytest.approx(75.0)
    assert majority_score("f1", labels) == pytest.approx(100 * 2 * 0.75 / 1.75)  # precision 3/4, recall 1
    assert majority_score("mcc", labels) == 0.0               # a constant prediction: Matthews is 0 (sklearn)
    assert majority_score("f1", np.array([0, 0, 1, 1])) == 0.0  # a tie: the smaller id, 0 (1 would give F1 66.67)
    assert majority_score("spearman", np.array([0.5, 3.2], dtype=np.float32)) is None  # STS-B: no majority class
