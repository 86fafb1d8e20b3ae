"""Is UniPELT's gain over the best single method more than seed noise? (§4.3, "gains of 1~4%").

For each K and task (Avg. included, from the per-seed averages), each gated UniPELT variant is compared
with the single method (fine-tuning, BitFit, adapter, prefix-tuning, LoRA) of highest mean in that cell,
by Welch's t-test over the data seeds (two-sided, unequal variances). The paper reports no such test.
"""
import warnings

import numpy as np
import pandas as pd
from scipy.stats import ttest_ind

from .names import SINGLE_METHODS, UNIPELT_SUBMODULES
from .scores import paper_order

ALPHA = 0.05
COLUMNS = ["k", "task", "method", "mean", "n", "best_single", "best_mean", "best_n", "difference", "p_value", "significant"]


def significance(table, alpha=ALPHA):
    """One row per (K, task, UniPELT variant) that has a score and a single method to compare with.

    `p_value` is NaN ("n/a") with fewer than 2 seeds on either side or when both sides are constant
    and equal; `significant` is p < alpha.
    """
    scores = table.seeds.groupby(["k", "method", "task"])["score"].apply(list)
    rows = []
    for (k, task), cells in table.cells.dropna(subset=["mean"]).groupby(["k", "task"]):
        singles = cells[cells["method"].isin(SINGLE_METHODS)]
        if singles.empty:
            continue
        best = singles.loc[singles["mean"].idxmax()]
        for unipelt in cells[cells["method"].isin(list(UNIPELT_SUBMODULES))].itertuples():
            p_value = welch_p_value(scores[k, unipelt.method, task], scores[k, best["method"], task])
            rows.append({
                "k": k, "task": task, "method": unipelt.method, "mean": unipelt.mean, "n": unipelt.n,
                "best_single": best["method"], "best_mean": best["mean"], "best_n": best["n"],
                "difference": unipelt.mean - best["mean"], "p_value": p_value, "significant": p_value < alpha,
            })
    return paper_order(pd.DataFrame(rows, columns=COLUMNS)).reset_index(drop=True)


def welch_p_value(scores, other):
    """Two-sided p-value of Welch's t-test; NaN with fewer than two scores on either side."""
    if len(scores) < 2 or len(other) < 2:
        return np.nan
    with warnings.catch_warnings():
        # scipy warns about precision when the scores are (nearly) constant; the p-value is still its answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(ttest_ind(scores, other, equal_var=False).pvalue)
