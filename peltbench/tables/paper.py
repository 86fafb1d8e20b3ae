"""The paper's own Tables 1-4 (typed into `results/paper/*.csv`) and "ours − paper" per cell."""
from pathlib import Path

import pandas as pd

from .scores import paper_order

PAPER_TABLES = ("table1", "table2", "table3", "table4")


def default_paper_dir():
    """`results/paper` of the checkout this package runs from (absent in a wheel install)."""
    return Path(__file__).resolve().parents[2] / "results" / "paper"


def load_paper(paper_dir):
    """The paper's tables as DataFrames keyed by name, or None when `paper_dir` lacks any of them.

    table1 / table3: k, method, task, mean, (std), mark; table2: k, upper_ap, unipelt_ap, upper_apl,
    unipelt_apl; table4: method, params, params_percent, train_time_percent, inference_time_percent.
    """
    paths = {name: Path(paper_dir) / f"{name}.csv" for name in PAPER_TABLES}
    if not all(path.is_file() for path in paths.values()):
        return None
    return {name: pd.read_csv(path, dtype={"k": str}, keep_default_na=False, na_values=[""]) for name, path in paths.items()}


def diff_cells(cells, paper_cells):
    """Tables 1 and 3 cell by cell: ours, the paper's, and ours − paper (NaN where either is missing).

    Rows are our cells plus the paper's cells we have no run for, so a gap in coverage shows too.
    """
    ours = cells[["k", "method", "task", "mean"]].rename(columns={"mean": "ours"})
    paper = paper_cells[["k", "method", "task", "mean"]].rename(columns={"mean": "paper"})
    paper = paper[paper["k"].isin(set(ours["k"]))]
    merged = ours.merge(paper, on=["k", "method", "task"], how="outer")
    merged["difference"] = merged["ours"] - merged["paper"]
    return paper_order(merged).reset_index(drop=True)


def diff_upper_bounds(bounds, paper_bounds):
    """Table 2 cell by cell, in the same long shape as `diff_cells` (column names as in table2.csv)."""
    ours = bounds.reset_index().melt(id_vars="k", var_name="column", value_name="ours")
    paper = paper_bounds.melt(id_vars="k", var_name="column", value_name="paper")
    merged = ours.merge(paper, on=["k", "column"], how="left")
    merged["difference"] = merged["ours"] - merged["paper"]
    return merged
