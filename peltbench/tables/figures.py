"""Figures 2 and 3 of the paper, and UniPELT's gates per layer (PNG via matplotlib).

Figures are built on `matplotlib.figure.Figure`, not pyplot, so importing this module never switches the
backend of a notebook and rendering needs no display. Each function returns None when the records hold
nothing to plot.
"""
import numpy as np
from matplotlib.figure import Figure

from .names import TASK_METRICS, TASKS, k_label, k_order, method_label, order_of, task_label
from .records import default_runs, swept_runs

REFERENCE_METHODS = ("ft", "unipelt_ap", "unipelt_apl")  # Figure 2's horizontal lines (the text compares with both UniPELTs)
GATED_METHODS = ("unipelt_apl", "unipelt_ap")            # the gate figure prefers APL: it has all three gates
SUBMODULES = ("adapter", "prefix", "lora_query", "lora_value")


def scored(runs):
    return runs[(runs["status"] == "ok") & runs["main"].notna()]


def bottleneck_runs(records, task=None, k=None):
    """The runs Figure 2 plots: adapter runs that change only the bottleneck, on CoLA, K = 100 (the paper's) or,
    without a curve there, the task and K with the most such runs, when at least two bottleneck sizes ran (one size
    is no curve). `task`, `k`: that setup only."""
    runs = scored(swept_runs(records, "adapter", "bottleneck"))
    sizes = runs.groupby(["task", "k"])["value"].nunique()
    curves = sizes[sizes >= 2].index
    if task is None and k is None and len(curves):
        counts = runs.set_index(["task", "k"]).index.value_counts()
        task, k = ("cola", "100") if ("cola", "100") in curves else min(
            curves, key=lambda setup: (-counts[setup], order_of(setup[0], TASKS), k_order(setup[1])))
    runs = runs[(runs["task"] == (task or "cola")) & (runs["k"] == (k or "100"))]
    return runs if runs["value"].nunique() >= 2 else runs.iloc[:0]


def lora_scale_runs(records):
    """The runs Figure 3 plots: LoRA runs that change only the scaling factor, in each (task, K) that has at
    least two values."""
    runs = scored(swept_runs(records, "lora", "lora_scale"))
    values = runs.groupby(["task", "k"])["value"].transform("nunique")
    return runs[values >= 2]


def bottleneck_figure(records, ddof=1, task=None, k=None, expected=None):
    """Figure 2: adapter score against bottleneck size D_mid on CoLA, K = 100 (or the setup `bottleneck_runs`
    chooses; mean ± std over data seeds, §4.2). `expected`: the seeds a point should have; fewer are marked."""
    runs = bottleneck_runs(records, task, k)
    if runs.empty:
        return None
    task, k = runs["task"].iloc[0], runs["k"].iloc[0]
    figure = Figure(figsize=(5.5, 3.8), layout="constrained")
    axes = figure.subplots()
    _mean_and_std(axes, runs, "Adapter", ddof, expected)
    references = scored(default_runs(records))
    references = references[(references["task"] == task) & (references["k"] == k)]
    for colour, method in enumerate(REFERENCE_METHODS, start=1):
        scores = references.loc[references["method"] == method, "main"]
        if len(scores):
            label = method_label(method) + (" (n = 1)" if len(scores) == 1 else "")
            axes.axhline(scores.mean(), linestyle="--", color=f"C{colour}", label=label)
    _power_of_two_axis(axes, runs["value"], "bottleneck size $D_{mid}$")
    axes.set_ylabel(f"{task_label(task)} test {TASK_METRICS.get(task, 'score')} (×100)")
    axes.set_title(f"Figure 2: adapter bottleneck size ({task_label(task)}, {k_label(k)})")
    axes.legend(fontsize="small")
    return figure


def lora_scale_figure(records, ddof=1, expected=None):
    """Figure 3: LoRA score against its scaling factor α, one panel per (task, K) that was swept (§4.2)."""
    runs = lora_scale_runs(records)
    setups = sorted(set(zip(runs["task"], runs["k"])), key=lambda setup: (order_of(setup[0], TASKS), k_order(setup[1])))
    if not setups:
        return None
    columns = min(2, len(setups))
    rows = -(-len(setups) // columns)
    figure = Figure(figsize=(5 * columns, 3.6 * rows), layout="constrained")
    panels = figure.subplots(rows, columns, squeeze=False).ravel()
    for axes, (task, k) in zip(panels, setups):
        setup = runs[(runs["task"] == task) & (runs["k"] == k)]
        _mean_and_std(axes, setup, "LoRA", ddof, expected)
        _power_of_two_axis(axes, setup["value"], "scaling factor α")
        axes.set_ylabel(f"test {TASK_METRICS.get(task, 'score')} (×100)")
        axes.set_title(f"{task_label(task)}, {k_label(k)}")
    for axes in panels[len(setups):]:
        axes.set_visible(False)
    figure.suptitle("Figure 3: LoRA scaling factor")
    return figure


def swept_paths(records):
    """Paths of the runs with non-default settings that Figures 2 and 3 plot (for the console's counts)."""
    swept = [runs[runs["changed"].map(len) > 0] for runs in (bottleneck_runs(records), lora_scale_runs(records))]
    return set().union(*(set(runs["path"]) for runs in swept))


def most_runs_k(runs):
    """The K with the most runs (ties: the smallest K): figures that show one K per task use it."""
    return min(runs["k"].unique(), key=lambda k: (-(runs["k"] == k).sum(), k_order(k)))


def gate_runs(records):
    """(runs, left_out): the runs `gate_figure` averages, and [(path, why)] for each one it leaves out because a
    submodule's gates have another number of layers than most of those runs' (a record of another layout, or
    edited by hand): lists of unequal length have no mean per layer.

    The runs are UniPELT (APL) runs with gates (else AP), with default settings, at the K with the most of them.
    """
    runs = default_runs(records)
    runs = runs[(runs["status"] == "ok") & runs["gates"].map(lambda gates: isinstance(gates, dict) and bool(gates))]
    runs = runs[runs["method"].isin(GATED_METHODS)]
    if runs.empty:
        return runs, []
    method = next(method for method in GATED_METHODS if method in set(runs["method"]))
    runs = runs[runs["method"] == method]
    runs = runs[runs["k"] == most_runs_k(runs)]
    layers = {submodule: _usual_length(runs["gates"], submodule) for submodule in SUBMODULES}
    why = runs["gates"].map(lambda gates: "; ".join(
        f"{submodule}: {len(gates[submodule])} layers, not {layers[submodule]}" for submodule in SUBMODULES
        if gates.get(submodule) and len(gates[submodule]) != layers[submodule]))
    return runs[why == ""], [(path, reason) for path, reason in zip(runs["path"], why) if reason]


def _usual_length(gates, submodule):
    """The number of layers most records give `submodule` (ties: the larger)."""
    lengths = [len(record[submodule]) for record in gates if record.get(submodule)]
    return max(set(lengths), key=lambda length: (lengths.count(length), length)) if lengths else 0


def gate_figure(records):
    """UniPELT's mean gate value per layer and submodule on the test set, one panel per task (§3.2's gates).

    The paper argues from the gates but never plots them. Shown for UniPELT (APL) when it has gate
    records (else AP), at the K with the most such records, averaged over data seeds (`gate_runs`).
    """
    runs, _ = gate_runs(records)
    if runs.empty:
        return None
    method, k = runs["method"].iloc[0], runs["k"].iloc[0]
    tasks = sorted(runs["task"].unique(), key=lambda task: order_of(task, TASKS))
    columns = min(4, len(tasks))
    rows = -(-len(tasks) // columns)
    figure = Figure(figsize=(max(3.6 * columns, 6.5), 3 * rows), layout="constrained")  # wide enough for the title
    panels = figure.subplots(rows, columns, squeeze=False, sharey=True).ravel()
    for axes, task in zip(panels, tasks):
        gates = runs.loc[runs["task"] == task, "gates"]
        _gate_lines(axes, gates)
        axes.set_title(f"{task_label(task)} (n = {len(gates)})")
        axes.set_xlabel("layer")
        axes.set_ylim(0, 1)
    for axes in panels[len(tasks):]:
        axes.set_visible(False)
    panels[0].set_ylabel("mean gate value")
    panels[0].legend(fontsize="small")
    figure.suptitle(f"{method_label(method)}: mean gate per layer on the test set\n({k_label(k)}, mean over n data seeds)")
    return figure


def _gate_lines(axes, gates):
    """One line per submodule: the layer-wise gates averaged over the seeds' records."""
    for colour, submodule in enumerate(SUBMODULES):
        per_seed = [record[submodule] for record in gates if record.get(submodule)]
        if per_seed:
            mean = np.mean(np.array(per_seed, dtype=float), axis=0)
            axes.plot(np.arange(1, len(mean) + 1), mean, marker=".", color=f"C{colour}", label=submodule)


def _mean_and_std(axes, runs, label, ddof, expected=None):
    """Mean ± std over data seeds (std with `ddof`) per swept value; a point from one seed is hollow and
    says n = 1, as it has no error bar; a point from fewer seeds than `expected` says how many (n=2)."""
    stats = runs.groupby("value")["main"].agg(["mean", "count"])
    stats["std"] = runs.groupby("value")["main"].std(ddof=ddof)
    line = axes.errorbar(stats.index, stats["mean"], yerr=stats["std"].fillna(0), marker="o", capsize=3, label=label)
    single = stats[stats["count"] == 1]
    if len(single):
        colour = line.lines[0].get_color()
        axes.plot(single.index, single["mean"], linestyle="none", marker="o", markersize=9,
                  markerfacecolor="white", markeredgecolor=colour, label=f"{label}: n = 1 (one seed)")
        for value, mean in single["mean"].items():
            axes.annotate("n=1", (value, mean), textcoords="offset points", xytext=(6, 6), fontsize="small", color=colour)
    few = stats[(stats["count"] > 1) & (stats["count"] < (expected or 0))]
    for value, row in few.iterrows():
        axes.annotate(f"n={int(row['count'])}", (value, row["mean"]), textcoords="offset points", xytext=(6, 6),
                      fontsize="small", color=line.lines[0].get_color())


def _power_of_two_axis(axes, values, label):
    """Swept sizes and scales grow geometrically: a log2 axis with the swept values as ticks."""
    ticks = sorted(set(values))
    axes.set_xscale("log", base=2)
    axes.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    axes.set_xlabel(label)
