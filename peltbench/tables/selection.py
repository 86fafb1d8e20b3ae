"""`peltbench-tables --select method.lr`: a method setting chosen on dev, per method × task × K.

A grid such as `peltbench -m method=lora,adapter method.lr=1e-4,3e-4,1e-3 task=rte fuse=true` leaves one run per
setting and data seed. Per method, task and K, each value of the selected keys (several keys: each combination) is
a candidate; its runs are those whose method settings are the method's defaults except in the selected keys. The
chosen candidate is the one whose dev score (`dev_best.main`: the best epoch's) has the highest mean over the data
seeds that every candidate of the cell has: candidates are never compared on unequal seed sets, and a candidate
that lacks a seed others have is named (`missing_seeds`, and a note). Ties go to the first candidate in value order.
The chosen candidate's test scores are then summarised over its seeds by the reported statistic (mean ± std, or
the median where the protocol reports medians: `STATISTICS`).

A candidate stopped by successive halving (`halving=η`, peltbench.halving: records of status `pruned`) is listed
with `pruned_at`, the rung it stopped at, and its dev mean there (no test score); it is never chosen: the survivors
trained the whole protocol and the pruned did not.
"""
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import UserError
from .comparability import canonical
from .scores import paper_order

# The statistic a table reports over data seeds: the protocol decides it (UniPELT: mean ± std; the full-data
# papers of VeRA / FourierFT: the median of 5). This is the one place a render's choice arrives.
STATISTICS = ("mean", "median")
DEFAULT_STATISTIC = "mean"
NOT_A_SETTING = "n/a"  # the value of a selected key for a method that has no such setting
COLUMNS = ["method", "task", "k", "key", "value", "seeds", "dev_mean", "test_mean", "test_std", "test_median",
           "compared_seeds", "missing_seeds", "pruned_at", "chosen"]


@dataclass
class Chosen:
    """One render's selection: every candidate (`rows`, selection.csv) and what the reader must be told."""

    keys: tuple                 # setting names without `method.`, e.g. ("lr",)
    rows: pd.DataFrame          # COLUMNS, one row per candidate
    notes: list = field(default_factory=list)  # cells with missing seeds, or with no seed all candidates share

    @property
    def label(self):
        return ",".join(f"method.{key}" for key in self.keys)


def parse_keys(options):
    """`--select method.lr --select method.lora_rank` or `method.lr,method.lora_rank` -> ("lr", "lora_rank")."""
    keys = []
    for option in options or ():
        for key in filter(None, (part.strip() for part in option.split(","))):
            group, dot, name = key.partition(".")
            if group != "method" or not dot or not name:
                raise UserError(f"--select {key}: only method settings are selected on dev (method.KEY, e.g. method.lr); "
                                "train.* and the rest are part of the protocol (--protocol)")
            if name not in keys:
                keys.append(name)
    return tuple(keys)


def _lists(frame, *columns):
    """`frame`'s columns as lists, to zip: a string column iterated by Python yields each value through Arrow (a
    tenth of the speed; 100,000 rows)."""
    return [frame[column].tolist() for column in columns]


def candidate_runs(runs, keys):
    """The runs a selection over `keys` compares: default settings except in `keys`, with each run's `value`."""
    unknown = [key for key in keys if not runs["settings"].map(lambda settings: key in settings).any()]
    if unknown:
        found = sorted({key for settings in runs["settings"] for key in settings})
        raise UserError(f"--select: no pooled run has method setting {', '.join(unknown)}; settings: {', '.join(found)}")
    inside = runs["changed"].map(lambda changed: set(changed) <= set(keys))
    runs = runs[inside]
    spelt = {}  # rows with equal settings share one dict (records.read_records): each spelt once, by its id

    def value(settings):
        if id(settings) not in spelt:
            spelt[id(settings)] = ",".join(canonical(settings[key]) if key in settings else NOT_A_SETTING for key in keys)
        return spelt[id(settings)]

    return runs.assign(value=runs["settings"].map(value))


def varied_keys(runs):
    """The method settings some pooled run changes from its method's defaults: what a selection can choose among."""
    return sorted({key for changed in runs["changed"] for key in changed})


def check_varied(runs, keys, candidates):
    """UserError (one line) for a selected key that takes one value only in every method × task × K: nothing to
    choose on dev (a key nobody swept), so the selection would pass off a default as chosen. `candidates`:
    candidate_runs(runs, keys)."""
    for key in keys:
        values = candidates["settings"].map(lambda settings: canonical(settings[key]) if key in settings else None)
        present = candidates.assign(_value=values)[values.notna()]
        counts = present.groupby(["method", "task", "k"])["_value"].nunique()
        if not (counts > 1).any():
            single = present.groupby("method")["_value"].agg(lambda found: "/".join(sorted(set(found))))
            held = "; ".join(f"{method}: {value} only" for method, value in single.items()) or "no candidate run"
            varied = ", ".join(f"method.{name}" for name in varied_keys(runs)) or "none"
            raise UserError(f"--select method.{key}: no method, task and K has runs at two values of it ({held}), so "
                            f"nothing is chosen on dev; settings these runs vary: {varied}")


def left_out(runs, keys, candidates):
    """Notes for the methods × tasks × K whose pooled runs are all outside the selection (each changes a setting
    that is not selected): never dropped silently. `candidates`: candidate_runs(runs, keys)."""
    inside = set(zip(*_lists(candidates, "method", "task", "k")))
    notes = []
    for (method, task, k), cell in runs.groupby(["method", "task", "k"], sort=False):
        if (method, task, k) not in inside:
            others = sorted({name for changed in cell["changed"] for name in changed} - set(keys))
            notes.append(f"{method}, {task}, K = {k}: not in the selection: its {len(cell)} run(s) change "
                         f"{', '.join(f'method.{name}' for name in others)} (not selected; add it to --select to choose it too)")
    return notes


def select_settings(runs, keys, ddof=1):
    """The Chosen of `runs` (one model and protocol, one record per seed) over the method settings `keys`."""
    candidates = candidate_runs(runs, keys)  # once (100,000 rows: each a few pandas maps)
    check_varied(runs, keys, candidates)
    notes = left_out(runs, keys, candidates)
    runs = candidates
    usable = runs[((runs["status"] == "ok") & runs["dev_main"].notna() & runs["main"].notna())
                  | ((runs["status"] == "pruned") & runs["dev_main"].notna())]
    rows = []
    for (method, task, k), cell in usable.groupby(["method", "task", "k"], sort=False):
        cell_rows, note = _cell(cell, ddof)
        rows += [{"method": method, "task": task, "k": k, "key": ",".join(f"method.{key}" for key in keys), **row}
                 for row in cell_rows]
        if note:
            notes.append(f"{method}, {task}, K = {k}: {note}")
    unscored = sorted(set(zip(*_lists(runs, "method", "task", "k"))) - set(zip(*_lists(usable, "method", "task", "k"))))
    notes += [f"{method}, {task}, K = {k}: no candidate has a dev and a test score (failed runs): nothing chosen, "
              "its runs are shown as they are" for method, task, k in unscored]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    notes += _single_candidates(frame, keys)
    return Chosen(keys, paper_order(frame).reset_index(drop=True) if len(frame) else frame, notes)


def _single_candidates(frame, keys):
    """One note per method whose every cell has one candidate: shown at that setting, which dev did not choose."""
    notes = []
    for method, rows in frame.groupby("method", sort=False):
        if rows.groupby(["task", "k"]).size().max() == 1:
            values = ", ".join(sorted(set(rows["value"]), key=_value_order))
            notes.append(f"{method}: one candidate in each cell ({', '.join(f'method.{key}' for key in keys)} = {values}): "
                         "shown at that setting, nothing chosen on dev")
    return notes


def _cell(cell, ddof):
    """Each candidate of one method × task × K as a row, the chosen one marked; and a note when seeds are missing.
    Read as arrays once per cell (a grid of 84 learning rates has 84 candidates a cell: a frame filtered per candidate
    cost 20,000 small pandas selections at 100,000 records)."""
    values = cell["value"].to_numpy(dtype=object)
    seed_of = cell["seed"].to_numpy()
    dev = cell["dev_main"].to_numpy(dtype=float)
    main = cell["main"].to_numpy(dtype=float)
    pruned_at = cell["pruned_at"].to_numpy(dtype=float) if "pruned_at" in cell else np.full(len(cell), np.nan)
    where: dict = {}
    for index, value in enumerate(values):
        where.setdefault(value, []).append(index)
    seeds = {value: set(seed_of[rows].tolist()) for value, rows in where.items()}
    shared = set.intersection(*seeds.values())
    every = set.union(*seeds.values())
    rows = []
    in_shared = np.isin(seed_of, list(shared))  # once per cell, not per candidate
    compared_seeds = _seed_list(shared)
    for value in sorted(seeds, key=_value_order):
        at = np.asarray(where[value])
        compared = dev[at[in_shared[at]]]
        test = main[at]
        test = test[~np.isnan(test)]
        pruned = pruned_at[at]
        pruned = pruned[~np.isnan(pruned)]
        rows.append({
            "value": value, "seeds": _seed_list(seeds[value]),
            "dev_mean": _mean(compared) if len(compared) else np.nan,
            "test_mean": test.mean() if len(test) else np.nan, "test_std": test.std(ddof=ddof) if len(test) > ddof else np.nan,
            "test_median": _median(test) if len(test) else np.nan, "compared_seeds": compared_seeds,
            "missing_seeds": _seed_list(every - seeds[value]),
            "pruned_at": int(pruned.max()) if len(pruned) else None, "chosen": False,
        })
    trained = [i for i, row in enumerate(rows) if row["pruned_at"] is None]
    if shared and trained:
        best = max(trained, key=lambda i: (rows[i]["dev_mean"], -i))
        rows[best]["chosen"] = True
    short = [row for row in rows if row["missing_seeds"]]
    if not short:
        return rows, None
    lacking = "; ".join(f"{row['value']} lacks seed(s) {row['missing_seeds']}" for row in short)
    if not shared:
        return rows, f"no data seed is shared by every candidate ({lacking}): nothing chosen"
    return rows, f"missing seeds ({lacking}): compared on the {len(shared)} seed(s) all candidates share ({_seed_list(shared)})"


def _median(values):
    """float(np.median(values)) of a float array without NaN, bit for bit (the middle value, or the two middle ones'
    sum halved, as numpy's mean of two takes it), without numpy's partition per candidate (20,000 of them). Values
    that compare equal are the same bits, but for 0.0 and -0.0, whose order among themselves numpy's partition
    decides: with a zero, numpy's own."""
    ordered = sorted(values.tolist())
    if 0.0 in ordered:
        return float(np.median(values))
    middle = len(ordered) // 2
    return float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _mean(values):
    """A float array's mean as pandas takes a Series' (nanops.nanmean: NaN as 0 in numpy's sum, over how many are not
    NaN; pandas never uses bottleneck for it), bit for bit: the dev mean a candidate is chosen by, as before, without
    a Series per candidate (20,000 candidates at 100,000 records)."""
    missing = np.isnan(values)
    count = len(values) - int(np.count_nonzero(missing))
    if not count:
        return np.nan
    return (np.where(missing, 0.0, values) if count < len(values) else values).sum(dtype=np.float64) / np.float64(count)


def _value_order(value):
    """Numbers in numeric order (1e-4 before 3e-4 before 1e-3), anything else after them as text."""
    parts = []
    for part in value.split(","):
        try:
            parts.append((0, float(part), ""))
        except ValueError:
            parts.append((1, 0.0, part))
    return parts


def _seed_list(seeds):
    return " ".join(str(seed) for seed in sorted(seeds))


def selected_runs(runs, chosen):
    """The runs of each cell's chosen candidate: what paired comparisons and the cost view compare after a selection."""
    candidates = candidate_runs(runs, chosen.keys)
    picked = chosen.rows[chosen.rows["chosen"]]
    keys = set(zip(*_lists(picked, "method", "task", "k", "value")))
    scored = set(zip(*_lists(chosen.rows, "method", "task", "k")))
    inside = [key in keys or key[:3] not in scored  # a cell whose every run failed: its failures are shown
              for key in zip(*_lists(candidates, "method", "task", "k", "value"))]
    return candidates[inside]


def chosen_cells(chosen, statistic=DEFAULT_STATISTIC):
    """The chosen candidate per method × task × K: its value and its test `centre` (mean or median) and `spread`."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic {statistic!r}: one of {', '.join(STATISTICS)}")
    rows = chosen.rows[chosen.rows["chosen"]]
    centre = rows["test_mean"] if statistic == "mean" else rows["test_median"]
    spread = rows["test_std"] if statistic == "mean" else pd.Series(np.nan, index=rows.index)
    n = rows["seeds"].map(lambda seeds: len(seeds.split()))
    return rows[["method", "task", "k", "value"]].assign(centre=centre, spread=spread, n=n)


def describe(chosen, statistic=DEFAULT_STATISTIC, ddof=1):
    """How the selection was made, for captions (Markdown and LaTeX alike)."""
    reported = (f"test mean ± std (ddof = {ddof})" if statistic == "mean" else "test median")
    return (f"Selected on dev per method, task and K: {chosen.label}, the value (a combination, for several keys) whose "
            "best-epoch dev score has the highest mean over the data seeds every candidate of the cell has (ties: the "
            f"smaller value); runs differ from the method's defaults in {chosen.label} only. Each cell: the chosen "
            f"setting's {reported} over its data seeds, the chosen value in brackets. selection.csv lists every candidate.")


def table_caption(chosen):
    """What a table rendered from the chosen settings (`selected_runs`) says about them."""
    return (f"Settings chosen on dev (--select {chosen.label}): each cell is its method's run at the value of "
            f"{chosen.label} whose mean best-epoch dev score is highest for that task and K (selection.md names each "
            "chosen value, selection.csv every candidate), not the method's default.")

