"""The cost view: score against what a method costs, one point per method, the Pareto front drawn (as PEFT's method
comparison shows it). Three costs, one PNG each, one panel per task × K and one for the average over tasks per K:

- trainable parameters (`trainable_params`: stored per task, head excluded),
- training seconds per step (`train_seconds_share / train_steps`),
- peak memory (`peak_memory`: CUDA's max allocated, or on a CPU the process's peak RSS since the group started, or
  its lifetime peak where that could not be reset; labelled as recorded).

The cost axis is logarithmic for parameters and time where a panel's costs span a decade or more (within less its
ticks would crowd), else linear, and says which. A point is the protocol's statistic of the test score over the
method's data seeds in that panel (the mean, with a bar of ± 1 std; under a median protocol such as full_median the
median, with a bar from the 25th to the 75th percentile), its cost the mean over the same runs. A fused run
(`fused.size` > 1: trained together with others on one backbone) shares its group's steps and memory. Its time is
its group's step time split by its share of the rows trained (`train_seconds_share`: 1/N of each step while N runs
train; for a run alone, `train_seconds`); a fused record written before that field holds only its group's seconds
and is left out of the time points, the figure saying how many. Its memory is its group's peak, not its own: drawn
ringed, the figure saying the group's size (`memory_shared_by` in fig_cost.csv). Its parameters are its own. The
Avg. panel of a K covers only the tasks every method of that K has (its title names them when they are not all of
the K's; fig_cost.csv's `tasks`): a method's score there is the statistic of its per-seed averages over those tasks,
as Table 1's Avg., its cost the mean of its task costs (none unless every one of those tasks has it). The Pareto
front joins the points no other point beats: none at most as costly and scoring at least as high, one of them
strictly. fig_cost.csv holds every point.
"""
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .efficiency import is_fused
from .names import AVG, METHODS, TASKS, k_label, k_order, method_label, order_of, task_label

COSTS = {  # column -> (file, axis label, log scale where a panel's costs span a decade or more)
    "trainable_params": ("fig_cost_params.png", "trainable parameters (stored per task)", True),
    "seconds_per_step": ("fig_cost_time.png", "training seconds per step", True),
    "peak_memory_gib": ("fig_cost_memory.png", "peak memory, GiB", False),
}
MEASURES = {"cuda_max_memory_allocated": "CUDA max allocated", "process_peak_rss": "CPU: the process's lifetime peak RSS",
            "process_peak_rss_since_group_start": "CPU: the process's peak RSS since the run's group started"}
RING = dict(marker="o", markersize=14, markerfacecolor="none", markeredgecolor="0.35", markeredgewidth=1.0,
            linestyle="none")  # around a fused run's memory point: its group's peak


def _summary(values, statistic):
    """(score, low, high) over seeds: the mean ± 1 std (ddof 1; no bar for one seed), or under a median protocol the
    median with the seeds' 25th and 75th percentiles (numpy's linear interpolation)."""
    values = np.asarray(values, dtype=float)
    if statistic == "median":
        low, middle, high = np.percentile(values, [25, 50, 75])
        return float(middle), float(low), float(high)
    mean = float(values.mean())
    spread = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return mean, mean - spread, mean + spread


def cost_points(runs, statistic="mean"):
    """One row per (k, task, method), the task AVG included: score (the protocol's `statistic` over seeds), its error
    bar (score_low, score_high), n, each cost (NaN where none is recorded), the memory's `memory_measures`, and
    `memory_shared_by`: the sizes of the fused groups whose peak its memory is ("" where every run trained alone)."""
    ok = scored(runs)
    if ok.empty:
        return pd.DataFrame(columns=["k", "task", "method", "score", "score_low", "score_high", "n", *COSTS,
                                     "memory_measures", "memory_shared_by", "tasks"])
    fused = is_fused(ok)
    steps = _numbers(ok["train_steps"])
    memory = _numbers(ok["peak_memory"])
    frame = ok.assign(
        seconds_per_step=own_train_seconds(ok) / steps.where(steps > 0),
        peak_memory_gib=memory / 2 ** 30,
        trainable_params=_numbers(ok["trainable_params"]),
        memory_measures=ok["peak_memory_measures"].where(memory.notna()),
        memory_shared_by=_numbers(ok["fused_size"]).where(fused & memory.notna()))
    grouped = frame.groupby(["k", "task", "method"])
    points = grouped.agg(n=("main", "count"), trainable_params=("trainable_params", "mean"),
                         seconds_per_step=("seconds_per_step", "mean"), peak_memory_gib=("peak_memory_gib", "mean"),
                         memory_measures=("memory_measures", lambda values: ", ".join(sorted(set(values.dropna())))),
                         memory_shared_by=("memory_shared_by", _sizes)).reset_index()
    summaries = [_summary(group["main"], statistic) for _, group in grouped]
    points.insert(3, "score", [score for score, _, _ in summaries])
    points.insert(4, "score_low", [low for _, low, _ in summaries])
    points.insert(5, "score_high", [high for _, _, high in summaries])
    points["tasks"] = points["task"]
    return pd.concat([points, _averages(points, frame, statistic)], ignore_index=True)


def scored(runs):
    """The runs a point counts: ok, with a test score."""
    return runs[(runs["status"] == "ok") & runs["main"].notna()]


def own_train_seconds(runs):
    """Each run's own training seconds: `train_seconds_share` (a fused run's part of its group's seconds, by its share
    of the rows; a run alone's equals `train_seconds`), else for a run alone `train_seconds`; NaN for a fused run whose
    record predates the share (it holds only its group's seconds)."""
    share = _numbers(runs["train_seconds_share"])
    return share.where(share.notna(), _numbers(runs["train_seconds"]).where(~is_fused(runs)))


def fused_without_share(runs):
    """How many scored fused runs have no time of their own (records from before `train_seconds_share`)."""
    ok = scored(runs)
    return int((is_fused(ok) & _numbers(ok["train_seconds_share"]).isna()).sum())


def _numbers(values):
    return pd.to_numeric(values, errors="coerce")


def _sizes(values):
    """Fused group sizes, e.g. "8" or "2, 8" ("" for none)."""
    return ", ".join(str(size) for size in sorted({int(value) for value in values.dropna()}))


def _all_sizes(listed):
    """The sizes that `_sizes` strings list, joined the same way."""
    return _sizes(pd.Series([int(size) for sizes in listed for size in filter(None, sizes.split(", "))], dtype=float))


def _averages(points, frame, statistic):
    """Per K: the Avg. panel over the tasks every method of that K has (none when they share no task).

    A method's score there is the `statistic` of its per-seed averages over those tasks (seeds that have them all),
    as Table 1's Avg.; a cost is the mean of its task costs, NaN unless every one of those tasks has it."""
    rows = []
    for k, block in points.groupby("k"):
        tasks = sorted(set.intersection(*(set(rows_of["task"]) for _, rows_of in block.groupby("method"))),
                       key=lambda task: order_of(task, TASKS))
        if not tasks:
            continue
        for method, rows_of in block[block["task"].isin(tasks)].groupby("method"):
            runs = frame[(frame["k"] == k) & (frame["method"] == method) & frame["task"].isin(tasks)]
            per_seed = runs.groupby("seed").filter(lambda seed: seed["task"].nunique() == len(tasks))
            averages = per_seed.groupby(["seed", "task"])["main"].mean().groupby("seed").mean()
            score, low, high = _summary(averages, statistic) if len(averages) else (rows_of["score"].mean(),) * 3
            rows.append({"k": k, "task": AVG, "method": method, "score": score, "score_low": low, "score_high": high,
                         "n": len(averages), **{cost: rows_of[cost].mean(skipna=False) for cost in COSTS},
                         "memory_measures": ", ".join(sorted(set(filter(None, rows_of["memory_measures"])))),
                         "memory_shared_by": _all_sizes(rows_of["memory_shared_by"]),
                         "tasks": " ".join(tasks)})
    return pd.DataFrame(rows, columns=points.columns)


def pareto(costs, scores):
    """Boolean mask of the points on the front: no other point is at most as costly and scores at least as high, with
    one of the two strictly (NaN: off)."""
    costs, scores = np.asarray(costs, dtype=float), np.asarray(scores, dtype=float)
    on = np.zeros(len(costs), dtype=bool)
    for i in range(len(costs)):
        if np.isnan(costs[i]) or np.isnan(scores[i]):
            continue
        rivals = ~np.isnan(costs) & (costs <= costs[i]) & (scores >= scores[i]) & ((costs < costs[i]) | (scores > scores[i]))
        on[i] = not rivals.any()
    return on


def with_fronts(points):
    """`points` with one `pareto_<cost>` column per cost, decided within each panel (k, task)."""
    points = points.copy()
    for cost in COSTS:
        column = f"pareto_{cost}"
        points[column] = False
        for _, panel in points.groupby(["k", "task"]):
            points.loc[panel.index, column] = pareto(panel[cost], panel["score"])
    return points


def panels(points):
    """(k, task) of each panel in reading order: K rows, the paper's task order, Avg. last."""
    keys = {(k, task) for k, task in zip(points["k"], points["task"])}
    return sorted(keys, key=lambda key: (k_order(key[0]), order_of(key[1], (*TASKS, AVG))))


def cost_figure(points, cost, title):
    """One panel per (k, task) with points for `cost`; None when no point has that cost. A method has the same colour
    and marker in every figure of `points`, whether or not the others have its cost (a fused run's older record: no
    time)."""
    drawn = points.dropna(subset=[cost, "score"])
    if drawn.empty:
        return None
    keys = panels(drawn)
    ks = sorted({k for k, _ in keys}, key=k_order)
    columns = max(sum(1 for key in keys if key[0] == k) for k in ks)
    figure = Figure(figsize=(3.2 * columns, 2.9 * len(ks) + 0.6), layout="constrained")
    grid = figure.subplots(len(ks), columns, squeeze=False)
    methods = sorted(set(drawn["method"]), key=lambda method: order_of(method, METHODS))
    style = styles(sorted(set(points["method"]), key=lambda method: order_of(method, METHODS)))  # as in every figure
    for row, k in enumerate(ks):
        in_row = [key for key in keys if key[0] == k]
        for column, axes in enumerate(grid[row]):
            if column >= len(in_row):
                axes.set_visible(False)
                continue
            _panel(axes, drawn[(drawn["k"] == k) & (drawn["task"] == in_row[column][1])], cost, style)
            task = in_row[column][1]
            axes.set_title(f"{task_label(task)}, {k_label(k)}" + _avg_over(drawn, k, task), fontsize="medium")
    handles = [grid[0][0].scatter([], [], color=style[m][0], marker=style[m][1], label=method_label(m)) for m in methods]
    if cost == "peak_memory_gib" and (drawn["memory_shared_by"] != "").any():
        handles.append(Line2D([], [], **RING, label="ringed: fused, its group's peak"))
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(methods), max(3, columns * 2)),
                  fontsize="small")
    figure.suptitle(title, fontsize="medium")
    return figure


def _avg_over(points, k, task):
    """An Avg. panel's title names its tasks when they are not all of that K's."""
    if task != AVG:
        return ""
    over = points[(points["k"] == k) & (points["task"] == AVG)]["tasks"].iloc[0].split()
    every = set(points[(points["k"] == k) & (points["task"] != AVG)]["task"])
    return "" if set(over) == every else "\nover " + ", ".join(map(task_label, over))


MARKERS = "os^Dv<>PX*"


def styles(methods):
    """method -> (colour, marker): the 10 colours of matplotlib's cycle, then the next marker shape, so every method
    of up to 100 has a style of its own (24 methods: 10 circles, 10 squares, 4 triangles)."""
    return {method: (f"C{i % 10}", MARKERS[(i // 10) % len(MARKERS)]) for i, method in enumerate(methods)}


def _panel(axes, panel, cost, style):
    _, label, log = COSTS[cost]
    single = panel["n"] == 1
    for method, point in panel.set_index("method").iterrows():
        bar = [[point["score"] - point["score_low"]], [point["score_high"] - point["score"]]] if point["n"] > 1 else None
        axes.errorbar(point[cost], point["score"], yerr=bar,  # one seed: no bar
                      color=style[method][0], marker=style[method][1], linestyle="none", capsize=2,
                      markerfacecolor=style[method][0] if point["n"] > 1 else "none",
                      elinewidth=0.8, zorder=3)
        if cost == "peak_memory_gib" and point["memory_shared_by"]:  # not its own memory: its fused group's peak
            axes.plot(point[cost], point["score"], **RING, zorder=4)
    front = panel[pareto(panel[cost], panel["score"])].sort_values(cost)
    axes.plot(front[cost], front["score"], color="0.4", linestyle="--", linewidth=1, zorder=2)
    if log and (panel[cost] > 0).all() and panel[cost].max() >= 10 * panel[cost].min():  # within a decade: linear,
        axes.set_xscale("log")                                                          # its ticks legible
        label += ", log scale"
    axes.set_xlabel(label, fontsize="small")
    axes.set_ylabel("test score (×100)" + (", hollow: 1 seed" if single.any() else ""), fontsize="small")
    axes.grid(alpha=0.3)


def write_cost(out, runs, render):
    """fig_cost_*.png and fig_cost.csv from the pooled runs with default settings; returns index entries."""
    from .outputs import reported

    statistic = reported(render)
    points = with_fronts(cost_points(runs, statistic))
    if points.empty:
        return [("fig_cost_*.png", "not drawn: no run with a score yet")]
    out.csv("fig_cost.csv", points)
    entries = [("fig_cost.csv", "the cost view's points: mean test score, trainable parameters, seconds per step and "
                                "peak memory per method, task and K (avg = over the K's tasks), each cost's Pareto front")]
    about = f"{render.selection.model_label()}; {render.selection.protocol}"
    for cost, (name, label, _) in COSTS.items():
        measures = sorted(set(filter(None, ", ".join(points["memory_measures"].fillna("")).split(", "))))
        what = label + (f" ({'; '.join(MEASURES.get(m, m) for m in measures)})" if cost == "peak_memory_gib" and measures else "")
        bars = ("median over seeds, bars: 25th-75th percentile" if statistic == "median" else
                "mean over seeds, bars: ± 1 std")
        fused = fused_note(points, runs, cost)
        title = f"Test score ({bars}) against {what}\n{about}. Dashed: Pareto front; hollow: one seed."
        figure = cost_figure(points, cost, title + (f"\n{fused}" if fused else ""))
        if figure is None:
            entries.append((name, f"not drawn: no record has {label}" + (f". {fused}" if fused else "")))
            continue
        out.figure(name, figure)
        entries.append((name, f"test score against {what}, one point per method, per task × K and averaged"
                              + (f". {fused}" if fused else "")))
    return entries


def fused_note(points, runs, cost):
    """What the figure of `cost` says of fused runs ("" when it draws none): how their time is split, which of them
    have no time of their own, and that their memory is their group's."""
    if cost == "seconds_per_step":
        ok, notes = scored(runs), []
        if (is_fused(ok) & _numbers(ok["train_seconds_share"]).notna()).any():
            notes.append("A fused run's time: its group's step time split by its share of the rows (1/N while N runs "
                         "train).")
        left_out = fused_without_share(runs)
        if left_out:
            notes.append(f"{left_out} fused run(s) left out: their records (older) hold only their group's seconds.")
        return " ".join(notes)
    if cost == "peak_memory_gib":
        sizes = _all_sizes(points["memory_shared_by"])
        if sizes:
            return (f"Ringed: fused, its group's peak, shared by its {sizes.replace(', ', ' or ')} runs "
                    "(not the run's own).")
    return ""
