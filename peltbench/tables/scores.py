"""Scores of Tables 1-3: per-seed scores, cells (mean ± std over data seeds), Avg., best/second, upper bounds.

Definitions follow docs/protocol.md: a cell is the mean and standard deviation over the data seeds of `test.main`;
Avg. is the mean over seeds of the per-seed average over tasks, and its std the std of those per-seed
averages, counting only seeds that have every task of the table; Table 2's upper bound is the average
over tasks of the best submodule's mean score on each task.
"""
from dataclasses import dataclass

import pandas as pd

from ..protocols import statistic  # noqa: F401 (re-exported: what a table reports for a protocol, "mean" or "median")
from .formatting import center, printed
from .names import AVG, METHODS, TASKS, UNIPELT_SUBMODULES, k_order, method_order, order_of

CELL_KEYS = ["k", "method", "task"]


@dataclass
class ScoreTable:
    """One table of the paper's kind (Tables 1 and 3): a block per K, method rows × task columns + Avg."""

    cells: pd.DataFrame     # k, method, task, mean, std, median, statistic, n (seeds averaged), failed (runs), paper_row, rank (dense: 1 bold, 2 underlined)
    seeds: pd.DataFrame     # k, method, task, seed, score: what the cells summarise
    problems: pd.DataFrame  # k, method, task, seed, status, reason: failed runs and undefined scores, never averaged in
    tasks: tuple            # the task columns, in the paper's order


def score_table(runs, ddof=1, paper_rows=METHODS, reported="mean"):
    """Tables 1 and 3 from runs with default method settings (`records.default_runs`), one record per seed.

    `reported`: the statistic of the runs' protocol (`statistic(protocol)`): "mean" (cells print mean ± std) or
    "median" (cells print the median over seeds; Avg. the median of the per-seed averages); ranks follow it.

    Methods in `paper_rows` (the paper table's own rows) come first and are ranked; any other method is a
    row set apart after them, without a rank, so it never takes the paper methods' bold / underline.
    """
    tasks = tuple(sorted(set(runs["task"]), key=lambda task: order_of(task, TASKS)))
    seeds = seed_scores(runs, tasks)
    problems = problem_runs(runs)
    failed = problems[problems["status"] != "ok"].groupby(CELL_KEYS).size().rename("failed")
    cells = _grid(runs, tasks).join(_summarise(seeds, ddof), on=CELL_KEYS).join(failed, on=CELL_KEYS)
    cells[["n", "failed"]] = cells[["n", "failed"]].fillna(0).astype(int)
    cells["statistic"] = reported
    cells["paper_row"] = cells["method"].isin(paper_rows)
    cells = paper_order(cells, apart=True).reset_index(drop=True)
    cells["rank"] = _ranks(cells)
    return ScoreTable(cells=cells, seeds=seeds, problems=problems, tasks=tasks)


def seed_scores(runs, tasks):
    """One score per (K, method, task, seed) from the runs that finished with a score, plus the per-seed Avg."""
    usable = runs[(runs["status"] == "ok") & runs["main"].notna()]
    scores = usable[["k", "method", "task", "seed"]].assign(score=usable["main"])
    return pd.concat([scores, per_seed_average(scores, tasks)], ignore_index=True)


def per_seed_average(scores, tasks):
    """Avg. of one seed: the mean over all `tasks`; a seed missing any task has none (docs/protocol.md, Table 1)."""
    if scores.empty:
        return scores
    by_seed = scores.pivot_table(index=["k", "method", "seed"], columns="task", values="score")
    complete = by_seed.reindex(columns=list(tasks)).dropna()
    return complete.mean(axis=1).rename("score").reset_index().assign(task=AVG)


def problem_runs(runs):
    """Runs that give no score: failed ones (with their error) and ok ones whose main metric is null."""
    runs = runs[runs["status"] != "pruned"]  # stopped by successive halving: done, never in a table nor a failure
    problems = runs[(runs["status"] != "ok") | runs["main"].isna()]
    failed = problems["status"] != "ok"
    reasons = problems["error"].fillna("failed").where(failed, "score undefined (test.main is null)")
    problems = problems.assign(reason=reasons)[["k", "method", "task", "seed", "status", "reason"]]
    return paper_order(problems).reset_index(drop=True)


def _grid(runs, tasks):
    """Every cell the table shows: each method that has any run at a K, × the tasks and Avg."""
    pairs = runs[["k", "method"]].drop_duplicates()
    grid = pd.DataFrame(
        [(k, method, task) for k, method in pairs.itertuples(index=False) for task in (*tasks, AVG)],
        columns=CELL_KEYS,
    )
    return paper_order(grid).reset_index(drop=True)


def _summarise(seeds, ddof):
    """Mean, std (over data seeds, with `ddof`) and number of seeds per cell."""
    groups = seeds.groupby(CELL_KEYS)["score"]
    return pd.DataFrame({"mean": groups.mean(), "std": groups.std(ddof=ddof), "median": groups.median(),
                         "n": groups.count()})


def _ranks(cells):
    """Dense rank per K and column of the paper rows' means as printed: ties share bold, as in Table 3's SST-2."""
    shown = pd.Series([printed(center(cell)) for cell in cells.itertuples()], index=cells.index).where(cells["paper_row"])
    return shown.groupby([cells["k"], cells["task"]]).rank(method="dense", ascending=False)


def paper_order(frame, apart=False):
    """Rows in the paper's order: K, then method, then task (Avg. last); with `apart`, the rows that are not
    the paper table's (`paper_row` False) after those that are, within each K."""
    keys = {
        "k": k_order,
        "method": method_order,
        "task": lambda task: order_of(task, (*TASKS, AVG)),
    }
    if apart:
        frame = frame.assign(_apart=~frame["paper_row"])
        columns = ["k", "_apart", "method", "task"]
        ordered = frame.sort_values(columns, key=lambda column: column if column.name == "_apart" else _positions(column, keys[column.name]))
        return ordered.drop(columns="_apart")
    return frame.sort_values(list(keys), key=lambda column: _positions(column, keys[column.name]))


def _positions(column, key):
    """Each value's place in `column`'s distinct values sorted by `key` (sort_values wants plain numbers)."""
    order = sorted(set(column), key=key)
    return column.map({value: place for place, value in enumerate(order)})


def upper_bounds(cells):
    """Table 2: per K, each UniPELT variant's average task mean beside the upper bound of its submodules.

    Both columns average over the same tasks (the table's), so they compare like for like; either is NaN
    when a method it needs misses a task. With every seed present UniPELT's equals its Table 1 Avg.
    """
    means = cells[cells["task"] != AVG].set_index(["k", "task", "method"])["mean"].unstack("method")
    columns = {}
    for unipelt, submodules in UNIPELT_SUBMODULES.items():
        suffix = unipelt.removeprefix("unipelt_")
        best_submodule = means.reindex(columns=list(submodules)).max(axis=1, skipna=False)
        columns[f"upper_{suffix}"] = _average_over_tasks(best_submodule)
        columns[unipelt] = _average_over_tasks(means.reindex(columns=[unipelt])[unipelt])
    table = pd.DataFrame(columns)
    return table.loc[sorted(table.index, key=k_order)].rename_axis("k")


def _average_over_tasks(per_task):
    """Mean over the tasks of each K; NaN when any task is missing (no partial averages)."""
    return per_task.groupby(level="k").agg(lambda values: values.mean(skipna=False))
