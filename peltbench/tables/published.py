"""Published GLUE tables beyond UniPELT (results/paper/published/*.csv, as printed) beside ours: published_<name>.md.

A published table stands beside a render that pools its model (`TABLES`). Ours per cell: the reported statistic
(mean, or median where the protocol reports medians) over the data seeds of each method's compared runs (default
settings, or the setting `--select` chose) with K = all, on the metric the table prints (`METRICS`: the table's
header names it; else peltbench's main metric). Compare a row only under the protocol the table used (`TABLES`):
the caption names both.
"""
from pathlib import Path

import numpy as np
import pandas as pd

from .formatting import MISSING, is_missing, number
from .markdown import frame_markdown
from .names import method_label, task_label
from .protocol import normalize_model

# file stem -> (the model it is of, its ids, the protocol it used, the metric of a task where not peltbench's main)
TABLES = {
    "roberta_base_glue": ("roberta-base", ("roberta-base", "FacebookAI/roberta-base"), "full_median", {"stsb": "pearson"}),
    "deberta_v3_base_glue": ("microsoft/deberta-v3-base", ("microsoft/deberta-v3-base",), "full_mean", {}),
}
ROW_NAMES = {"lora_r8": "lora", "oft_b16": "oft", "boft_m2_b8": "boft", "hra_r8": "hra"}  # as printed -> config name
AVERAGES = ("avg", "all")  # the papers' average column


def load_published(paper_dir):
    """{stem: DataFrame (method, params, one column per task, avg)} for every published table found."""
    folder = Path(paper_dir) / "published"
    tables = {}
    for stem in TABLES:
        path = folder / f"{stem}.csv"
        if path.is_file():
            frame = pd.read_csv(path, comment="#")
            tables[stem] = frame.assign(method=frame["method"].map(lambda name: ROW_NAMES.get(name, name)))
    return tables


def matching_table(published, model):
    """The stem of the published table of `model` (a render's pooled model), or None."""
    for stem, (_, ids, _, _) in TABLES.items():
        if stem in published and normalize_model(model) in {normalize_model(name) for name in ids}:
            return stem
    return None


def ours(runs, stem, tasks, statistic="mean"):
    """{(method, task): (value, seeds)} of runs with K = all, on the table's metric for each task."""
    metrics = TABLES[stem][3]
    full = runs[(runs["k"] == "all") & (runs["status"] == "ok")]
    cells = {}
    for (method, task), rows in full.groupby(["method", "task"]):
        if task not in tasks:
            continue
        column = f"test_{metrics[task]}" if task in metrics else "main"
        values = pd.to_numeric(rows[column], errors="coerce").dropna() if column in rows else pd.Series(dtype=float)
        if len(values):
            cells[method, task] = (float(np.median(values) if statistic == "median" else values.mean()), len(values))
    return cells


def published_markdown(table, cells, stem, caption):
    tasks = [column for column in table.columns if column not in ("method", "params", *AVERAGES)]
    rows = []
    for method in [*table["method"], *sorted({m for m, _ in cells} - set(table["method"]))]:
        printed = table.set_index("method").loc[method] if method in set(table["method"]) else None
        rows.append([method_label(method), *(_cell(cells.get((method, task)), printed, task) for task in tasks)])
    header = ["Method", *(task_label(task) for task in tasks)]
    return "\n".join([f"# {stem}: ours beside the published numbers", "", caption, "",
                      "Each cell: ours (n = seeds), the published number in brackets.", "",
                      frame_markdown(pd.DataFrame(rows, columns=header)), ""])


def _cell(ours_cell, printed, task):
    theirs = MISSING if printed is None or is_missing(printed.get(task)) else f"{printed[task]:.2f}"
    mine = MISSING if ours_cell is None else f"{number(ours_cell[0])} (n = {ours_cell[1]})"
    return f"{mine} [{theirs}]"


def write_published(out, runs, render, paper_dir, statistic="mean"):
    """published_<stem>.md when the render pools a published table's model; returns index entries."""
    published = load_published(paper_dir)
    stem = matching_table(published, render.selection.model)
    if stem is None:
        return []
    table = published[stem]
    tasks = [column for column in table.columns if column not in ("method", "params", *AVERAGES)]
    metrics = TABLES[stem][3]
    what = "median" if statistic == "median" else "mean"
    caption = (f"Published: results/paper/published/{stem}.csv (its header names the source), protocol {TABLES[stem][2]}. "
               f"Ours: the {what} over data seeds of K = all runs, on "
               + (", ".join(f"{task_label(t)} {m}" for t, m in metrics.items()) + " and " if metrics else "")
               + "each other task's main metric. " + render.selection.caption()
               + f" Compare only runs of protocol {TABLES[stem][2]}.")
    out.text(f"published_{stem}.md", published_markdown(table, ours(runs, stem, tasks, statistic), stem, caption))
    return [(f"published_{stem}.md", f"ours beside the published {stem} table (K = all, {what} over seeds)")]
