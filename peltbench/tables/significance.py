"""Is UniPELT's gain over the best single method more than seed noise? (§4.3, "gains of 1~4%").

For each K and task (Avg. included, from the per-seed averages), each gated UniPELT variant is compared
with the single method (fine-tuning, BitFit, adapter, prefix-tuning, LoRA) of highest mean in that cell,
paired over the data seeds both ran (paired.py: the paired t-test, and the exact sign-flip test with its floor);
only where fewer than 2 seeds are shared, by Welch's unpaired t-test (`test` says which). The paper reports no test.
"""
import pandas as pd

from .names import SINGLE_METHODS, UNIPELT_SUBMODULES
from .paired import ALPHA, seed_test
from .scores import paper_order

COLUMNS = ["k", "task", "method", "mean", "n", "best_single", "best_mean", "best_n", "difference", "test", "pairs",
           "p_value", "sign_flip_p", "sign_flip_floor", "significant"]


def significance(table, alpha=ALPHA):
    """One row per (K, task, UniPELT variant) that has a score and a single method to compare with.

    `p_value` (the t-test's) is NaN ("n/a") with fewer than 2 seeds on either side or when the differences are
    all equal (or both sides constant and equal); `significant` is p < alpha. `difference` is of the cell means.
    """
    scores = {key: dict(zip(rows["seed"], rows["score"])) for key, rows in table.seeds.groupby(["k", "method", "task"])}
    rows = []
    for (k, task), cells in table.cells.dropna(subset=["mean"]).groupby(["k", "task"]):
        singles = cells[cells["method"].isin(SINGLE_METHODS)]
        if singles.empty:
            continue
        best = singles.loc[singles["mean"].idxmax()]
        for unipelt in cells[cells["method"].isin(list(UNIPELT_SUBMODULES))].itertuples():
            test = seed_test(scores[k, unipelt.method, task], scores[k, best["method"], task])
            p_value = test["t_p"]
            rows.append({
                "k": k, "task": task, "method": unipelt.method, "mean": unipelt.mean, "n": unipelt.n,
                "best_single": best["method"], "best_mean": best["mean"], "best_n": best["n"],
                "difference": unipelt.mean - best["mean"], "test": test["test"], "pairs": test["n"] if test["test"] == "paired" else 0,
                "p_value": p_value, "sign_flip_p": test["sign_flip_p"], "sign_flip_floor": test["sign_flip_floor"],
                "significant": p_value < alpha,
            })
    return paper_order(pd.DataFrame(rows, columns=COLUMNS)).reset_index(drop=True)
