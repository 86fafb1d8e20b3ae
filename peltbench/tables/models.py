"""Models side by side (`peltbench-tables --models A,B`): Table 1's cells of several encoders under one protocol.

One pipe table per K: a row per method, a column group per model (its tasks, then Avg.), each cell the mean ± std
over data seeds of that model's runs, ranked within its own column as in Table 1 (bold best, underlined second).
Each model's runs are chosen as a render of that model alone chooses them (`protocol.select`, `pooled`), and the
models must come out under the same protocol: comparing two encoders across protocols would measure the protocol
too, so that is refused in one line naming what differs.
"""
from types import SimpleNamespace

import pandas as pd

from .. import UserError
from .captions import benchmark_words
from .markdown import frame_markdown, score_cell
from .names import AVG, TASKS, k_label, k_order, method_label, order_of, task_label
from .comparability import describe_protocol, pooled, select
from .records import default_runs, one_record_per_seed
from .scores import score_table

NAME = "models"  # models.md / models.csv


def side_by_side(known, names, protocol, ddof):
    """(cells, selections): each model's Table 1 cells (column `model`: its label) under one protocol."""
    selections = [select(known, name, protocol) for name in names]
    models = [selection.model for selection in selections]
    if len(set(models)) < len(models):
        raise UserError(f"--models {','.join(names)}: names the same model twice ({', '.join(models)})")
    protocols = {selection.protocol for selection in selections}
    if len(protocols) > 1:
        found = "; ".join(f"{selection.model_label()}: {selection.protocol}" for selection in selections)
        raise UserError(f"--models: the models' runs come out under different protocols ({found}); choose one with "
                        f"--protocol, e.g. --protocol {sorted(protocols)[0]}")
    frames = []
    for selection in selections:
        chosen, _ = one_record_per_seed(known[pooled(known, selection)].assign(protocol=selection.protocol))
        runs = default_runs(chosen)
        runs = runs[runs["k"] != "all"]
        if runs.empty:
            raise UserError(f"--models: no run of {selection.model_label()} under {selection.protocol} at K = 100, "
                            f"500 or 1000 with the methods' default settings")
        frames.append(score_table(runs, ddof).cells.assign(model=selection.model_label()))
    return pd.concat(frames, ignore_index=True), selections


def models_markdown(cells, selections, expected):
    """models.md: per K, methods × (model, task) with each model's Avg. last in its group."""
    labels = [selection.model_label() for selection in selections]
    tasks = {label: sorted(set(cells.loc[(cells["model"] == label) & (cells["task"] != AVG), "task"]),
                           key=lambda task: order_of(task, TASKS)) + [AVG] for label in labels}
    header = ["Method", *(f"{label}: {task_label(task)}" for label in labels for task in tasks[label])]
    on = benchmark_words({task for listed in tasks.values() for task in listed})
    parts = [f"# Models side by side: results on {on} with K training examples (test)", "", caption(selections), ""]
    for k in sorted(set(cells["k"]), key=k_order):
        block = cells[cells["k"] == k].set_index(["model", "method", "task"])
        methods = list(dict.fromkeys(cells.loc[cells["k"] == k, "method"]))
        rows = [[method_label(method), *(_cell(block, (label, method, task), expected)
                                         for label in labels for task in tasks[label])] for method in methods]
        parts += [f"## {k_label(k)}", "", frame_markdown(pd.DataFrame(rows, columns=header)), ""]
    parts.append("**Bold**: best, <ins>underlined</ins>: 2nd best per column and K. `–`: no score."
                 + (f" `n=3`: fewer seeds than the {expected} expected." if expected > 1 else ""))
    return "\n".join(parts) + "\n"


def caption(selections):
    """Which runs each column group pools, and the one protocol they share."""
    pooled_models = "; ".join(f"{selection.model_label()} ({selection.model_reason})" for selection in selections)
    return (f"Mean and standard deviation over data seeds, main metric x100, of each model's runs with the methods' "
            f"default settings: {pooled_models}. Every model under the same protocol: "
            f"{describe_protocol(selections[0].protocol)}. Ranks are within each model's column.")


def _cell(block, key, expected):
    if key not in block.index:
        return "–"
    return score_cell(SimpleNamespace(**block.loc[key].to_dict()), expected)  # as Table 1's rows: attributes
