"""The cost view: score against what a method costs, one point per method, the Pareto front drawn (as PEFT's method
comparison shows it). Three costs, one PNG each, one panel per task × K and one for the average over tasks per K:

- trainable parameters (`trainable_params`: stored per task, head excluded),
- training seconds per step (a run alone: `train_seconds / train_steps`),
- peak memory (`peak_memory`: CUDA's max allocated, or on a CPU the process's peak RSS since the group started, or
  its lifetime peak where that could not be reset; labelled as recorded).

The cost axis is logarithmic for parameters and time where a panel's costs span a decade or more (within less its
ticks would crowd; minor ticks at 2 and 5 of each decade), else linear, and says which; a linear axis prints plain
numbers (no offset text) and spans at least ±10% of its points' middle, so readings within a few percent of each
other are not spread across the panel.
A point is the protocol's statistic of the test score over the method's data seeds in that panel (the mean, with a
bar of ± 1 std; under a median protocol such as full_median the median, with a bar from the 25th to the 75th
percentile), its cost the mean over the same runs.

A fused run (`fused.size` > 1: trained together with others on one backbone, one forward and backward per step for
all of them) has no time or memory of its own: what was measured is its group's. Each group's measurement is taken
once (`group_costs`), from all its members' records: its peak is the highest one they recorded (each member reads the
group's peak at its own end; the last, at the group's end, has it all), its time per step the seconds over the steps
of the member that trained longest (it trained in every period of the group: N runs per step while N trained).
Every member carries that one value, so the members of a group sit at one cost: drawn as one grey bar behind them,
the members side by side across it (a few points apart, in the methods' order: equal scores hid each other), said in
the title (`time_shared_by`, `memory_shared_by`: the groups' sizes, `fused_groups` in fig_cost.csv), and
left out of that cost's Pareto front: one shared measurement cannot say which of its members is cheaper. (Records
also hold `train_seconds_share`, the group's seconds split by the rows each member trained: a division of the
group's time, not a measurement of the member's, so the cost view does not draw it.) A method with runs alone and
fused runs in one panel is costed by its runs alone. Its parameters are its own either way.

The Avg. panel of a K covers only the tasks every method of that K has (its title names them when they are not all
of the K's; fig_cost.csv's `tasks`): a method's score there is the statistic of its per-seed averages over those
tasks, as Table 1's Avg., its cost the mean of its task costs (none unless every one of those tasks has it), shared
where any of them is. The Pareto front joins the points no other point beats: none at most as costly and scoring at
least as high, one of them strictly. fig_cost.csv holds every point.
"""
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, ScalarFormatter
from matplotlib.transforms import offset_copy

from .efficiency import is_fused
from .names import AVG, TASKS, k_label, k_order, method_label, method_order, order_of, task_label

COSTS = {  # column -> (file, axis label, log scale where a panel's costs span a decade or more)
    "trainable_params": ("fig_cost_params.png", "trainable parameters (stored per task)", True),
    "seconds_per_step": ("fig_cost_time.png", "training seconds per step", True),
    "peak_memory_gib": ("fig_cost_memory.png", "peak memory, GiB", False),
}
MEASURES = {"cuda_max_memory_allocated": "CUDA max allocated", "process_peak_rss": "CPU: the process's lifetime peak RSS",
            "process_peak_rss_since_group_start": "CPU: the process's peak RSS since the run's group started"}
# A cost that is a fused group's one measurement, shared by its members: which column says so, and what it is called
SHARED = {"seconds_per_step": ("time_shared_by", "step time"), "peak_memory_gib": ("memory_shared_by", "peak")}
BAR = dict(color="0.55", linewidth=9, alpha=0.35, solid_capstyle="round")  # behind the points of one shared measurement
POINT_COLUMNS = ["k", "task", "method", "score", "score_low", "score_high", "n", *COSTS, "memory_measures",
                 "time_shared_by", "memory_shared_by", "fused_groups", "tasks"]


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


def cost_points(runs, statistic="mean", members=None):
    """One row per (k, task, method), the task AVG included: score (the protocol's `statistic` over seeds), its error
    bar (score_low, score_high), n, each cost (NaN where none is recorded), the memory's `memory_measures`,
    `time_shared_by` / `memory_shared_by`: the sizes of the fused groups whose one measurement the cost is ("" where
    it is the runs' own), and `fused_groups`, their ids. `members`: the records a fused group's measurement is taken
    from (default `runs`; give every pooled record, so a member outside `runs`, such as another setting of a grid
    trained in the same group, counts too)."""
    ok = scored(runs)
    if ok.empty:
        return pd.DataFrame(columns=POINT_COLUMNS)
    fused = is_fused(ok)
    steps = _numbers(ok["train_steps"])
    own_seconds = _numbers(ok["train_seconds_share"]).fillna(_numbers(ok["train_seconds"]))  # equal for a run alone
    groups = group_costs(runs if members is None else members)
    group = ok["fused_group"].where(fused)
    size = _numbers(ok["fused_size"])
    frame = ok.assign(
        seconds_per_step=(own_seconds / steps.where(steps > 0)).where(~fused, group.map(groups["seconds_per_step"])),
        peak_memory_gib=_numbers(ok["peak_memory"]).where(~fused, group.map(groups["peak_bytes"])) / 2 ** 30,
        trainable_params=_numbers(ok["trainable_params"]))
    frame = frame.assign(time_shared_by=size.where(fused & frame["seconds_per_step"].notna()),
                         memory_shared_by=size.where(fused & frame["peak_memory_gib"].notna()))
    for cost, (shared, _) in SHARED.items():  # a method's runs alone, where it has some, cost it: never a mixture
        frame[cost] = _own_first(frame, cost, shared)
        frame[shared] = frame[shared].where(frame[cost].notna())
    frame = frame.assign(memory_measures=frame["peak_memory_measures"].where(frame["peak_memory_gib"].notna()),
                         fused_groups=group.where(frame["time_shared_by"].notna() | frame["memory_shared_by"].notna()))
    grouped = frame.groupby(["k", "task", "method"])
    points = grouped.agg(n=("main", "count"), trainable_params=("trainable_params", "mean"),
                         seconds_per_step=("seconds_per_step", "mean"), peak_memory_gib=("peak_memory_gib", "mean"),
                         memory_measures=("memory_measures", lambda values: ", ".join(sorted(set(values.dropna())))),
                         time_shared_by=("time_shared_by", _sizes), memory_shared_by=("memory_shared_by", _sizes),
                         fused_groups=("fused_groups", _ids)).reset_index()
    summaries = [_summary(group["main"], statistic) for _, group in grouped]
    points.insert(3, "score", [score for score, _, _ in summaries])
    points.insert(4, "score_low", [low for _, low, _ in summaries])
    points.insert(5, "score_high", [high for _, _, high in summaries])
    points["tasks"] = points["task"]
    return pd.concat([points, _averages(points, frame, statistic)], ignore_index=True)[POINT_COLUMNS]


def scored(runs):
    """The runs a point counts: ok, with a test score."""
    return runs[(runs["status"] == "ok") & runs["main"].notna()]


def group_costs(records):
    """Per fused group (index: `fused_group`): `peak_bytes` and `seconds_per_step`, each measured once for the group.

    The peak: the highest its members recorded (each reads the group's peak at its own end; the last member, at the
    group's end, has all of it). The time per step: `train_seconds / train_steps` of the member with the most steps
    (ties: the most seconds): it trained in every period of the group, so its seconds are the group's whole loop.
    Every member's record counts, whatever its status (a member that failed or was pruned trained in the group too)."""
    fused = records[is_fused(records) & records["fused_group"].notna()]
    frame = pd.DataFrame({"group": fused["fused_group"], "steps": _numbers(fused["train_steps"]),
                          "seconds": _numbers(fused["train_seconds"]), "peak": _numbers(fused["peak_memory"])})
    timed = frame[(frame["steps"] > 0) & frame["seconds"].notna()].sort_values(["steps", "seconds"])
    longest = timed.groupby("group").last()
    return pd.DataFrame({"seconds_per_step": longest["seconds"] / longest["steps"],
                         "peak_bytes": frame.groupby("group")["peak"].max()})


def _own_first(frame, cost, shared):
    """`cost` per run, NaN for a fused run whose method, task and K has a run alone with that cost (its own)."""
    own = frame[cost].notna() & frame[shared].isna()
    has_own = own.groupby([frame["k"], frame["task"], frame["method"]]).transform("any")
    return frame[cost].where(~has_own | own)


def _numbers(values):
    return pd.to_numeric(values, errors="coerce")


def _sizes(values):
    """Fused group sizes, e.g. "8" or "2, 8" ("" for none)."""
    return ", ".join(str(size) for size in sorted({int(value) for value in values.dropna()}))


def _all_sizes(listed):
    """The sizes that `_sizes` strings list, joined the same way."""
    return _sizes(pd.Series([int(size) for sizes in listed for size in filter(None, sizes.split(", "))], dtype=float))


def _ids(values):
    """Fused group ids, space-separated ("" for none)."""
    return " ".join(sorted({value for value in values.dropna() for value in str(value).split()}))


def _averages(points, frame, statistic):
    """Per K: the Avg. panel over the tasks every method of that K has (none when they share no task).

    A method's score there is the `statistic` of its per-seed averages over those tasks (seeds that have them all),
    as Table 1's Avg.; a cost is the mean of its task costs, NaN unless every one of those tasks has it, and shared
    (a fused group's) where any of them is."""
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
                         "time_shared_by": _all_sizes(rows_of["time_shared_by"]),
                         "memory_shared_by": _all_sizes(rows_of["memory_shared_by"]),
                         "fused_groups": _ids(rows_of["fused_groups"]), "tasks": " ".join(tasks)})
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
    """`points` with one `pareto_<cost>` column per cost, decided within each panel (k, task) among the points whose
    cost is their own: a fused group's shared measurement is never on the front and never puts a point off it."""
    points = points.copy()
    for cost in COSTS:
        column = f"pareto_{cost}"
        points[column] = False
        for _, panel in points.groupby(["k", "task"]):
            points.loc[panel.index, column] = front(panel, cost)
    return points


def shared(points, cost):
    """Mask of the points whose `cost` is a fused group's one measurement, not their own."""
    if cost not in SHARED:
        return pd.Series(False, index=points.index)
    return points[SHARED[cost][0]].fillna("").astype(str) != ""


def front(panel, cost):
    """The Pareto mask of one panel's points on `cost`, among the points whose cost is their own."""
    return pareto(panel[cost].where(~shared(panel, cost)), panel["score"])


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
    methods = sorted(set(drawn["method"]), key=method_order)
    style = styles(sorted(set(points["method"]), key=method_order))  # as in every figure
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
    if shared(drawn, cost).any():
        handles.append(Line2D([], [], **BAR, label=f"grey bar: one fused group's {SHARED[cost][1]}, shared"))
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), max(3, columns * 2)),
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
# A log axis's minor ticks: at 2 and 5 of each decade (matplotlib's default, 2 to 9, makes 8 tick objects a decade in
# every panel, each laid out and drawn three times: saving the parameter figure of Table 1's 27 panels took 6.7-7.7 s
# of CPU, 5.3-5.8 s with these), unlabelled as before (a log axis spans a decade or more here: no minor tick labelled).
MINOR_SUBS = (2.0, 5.0)


def styles(methods):
    """method -> (colour, marker): the 10 colours of matplotlib's cycle, then the next marker shape, so every method
    of up to 100 has a style of its own (24 methods: 10 circles, 10 squares, 4 triangles)."""
    return {method: (f"C{i % 10}", MARKERS[(i // 10) % len(MARKERS)]) for i, method in enumerate(methods)}


DODGE = 6.0  # points between the members of one shared measurement, drawn side by side (about a marker's width)


def dodges(panel, cost):
    """Each point's sideways offset in points (0 for a cost of its own). The members of one fused group share one
    cost exactly, so equal scores would hide each other (issue 40, 7: 4 methods, 2 visible): they are drawn DODGE
    apart, centred on their cost, in the methods' order (the same in every figure and panel). The cost they are drawn
    at, and fig_cost.csv's, stays the group's one value."""
    offsets = pd.Series(0.0, index=panel.index)
    common = shared(panel, cost)
    for _, points in panel[common].groupby(cost):
        order = sorted(points.index, key=lambda index: method_order(points.at[index, "method"]))
        for position, index in enumerate(order):
            offsets[index] = (position - (len(order) - 1) / 2) * DODGE
    return offsets


def _panel(axes, panel, cost, style):
    _, label, log = COSTS[cost]
    single = panel["n"] == 1
    common = shared(panel, cost)
    for value, points in panel[common].groupby(cost):  # one shared measurement: one bar behind all its points
        axes.plot([value, value], [points["score_low"].min(), points["score_high"].max()],  # as wide as they spread
                  **{**BAR, "linewidth": BAR["linewidth"] + DODGE * (len(points) - 1)}, zorder=1)
    if common.any():
        axes.margins(x=0.1)  # room for a bar's width at the panel's edge
    offsets = dodges(panel, cost)
    for offset, points in panel.groupby(offsets, sort=False):  # the points drawn at one sideways offset (0: their cost)
        place = offset_copy(axes.transData, fig=axes.figure, x=offset, units="points") if offset else axes.transData
        _points(axes, points, cost, style, place)
    on_front = panel[front(panel, cost)].sort_values(cost)
    axes.plot(on_front[cost], on_front["score"], color="0.4", linestyle="--", linewidth=1, zorder=2)
    if log and (panel[cost] > 0).all() and panel[cost].max() >= 10 * panel[cost].min():  # within a decade: linear,
        axes.set_xscale("log")                                                          # its ticks legible
        axes.xaxis.set_minor_locator(LogLocator(subs=MINOR_SUBS))
        label += ", log scale"
    else:
        _plain_linear_axis(axes, panel[cost], cost)
    axes.set_xlabel(label, fontsize="small")
    axes.set_ylabel("test score (×100)" + (", hollow: 1 seed" if single.any() else ""), fontsize="small")
    axes.grid(alpha=0.3)


CAP = 2.0  # points: half an error bar's cap, as errorbar's capsize=2
ERROR_WIDTH = 0.8  # an error bar's line width


def _points(axes, points, cost, style, place):
    """Each point's marker (hollow for one seed) and, for more seeds, its bar from score_low to score_high with caps,
    drawn at the transform `place` (one per sideways offset, not per point: each is a child of transData): the bars
    and caps of all `points` as one collection each, the markers over every bar (an errorbar per point made four
    artists, each laid out and drawn: the cost view took a third more time)."""
    methods, x, score, n = (points[column].tolist() for column in ("method", cost, "score", "n"))
    barred = [index for index, seeds in enumerate(n) if seeds > 1]
    if barred:
        colours = [style[methods[index]][0] for index in barred]
        xs = [x[index] for index in barred]
        low, high = points["score_low"].tolist(), points["score_high"].tolist()
        lows, highs = [low[index] for index in barred], [high[index] for index in barred]
        axes.vlines(xs, lows, highs, colors=colours, linewidth=ERROR_WIDTH, zorder=2.9, transform=place)
        axes.scatter(xs + xs, lows + highs, s=(2 * CAP) ** 2, c=colours + colours, marker="_", linewidths=1.0,
                     zorder=2.9, transform=place)
    for method, value, centre, seeds in zip(methods, x, score, n):
        colour, marker = style[method]
        axes.plot([value], [centre], color=colour, marker=marker, linestyle="none", zorder=3, transform=place,
                  markerfacecolor=colour if seeds > 1 else "none")


def _plain_linear_axis(axes, values, cost):
    """Plain tick labels (matplotlib's offset text, e.g. `1e-5+1.4706`, overprinted the axis label), parameters as
    300K / 1.2M; and where the points lie within 10% of each other (one group's peak read by each member, say), the
    axis spans ±10% of their middle instead of spreading that difference across the panel."""
    if cost == "trainable_params":
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: compact(value)))
    else:
        plain = ScalarFormatter(useOffset=False)
        plain.set_scientific(False)
        axes.xaxis.set_major_formatter(plain)
    low, high = float(values.min()), float(values.max())
    if high > 0 and high - low < 0.1 * high:
        middle = (low + high) / 2
        axes.set_xlim(0.9 * middle, 1.1 * middle)


def compact(value):
    """A parameter count as a short tick label: 950, 12K, 1.5M, 110M."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def write_cost(out, runs, render, members=None):
    """fig_cost_*.png and fig_cost.csv from the compared runs (default settings, or the ones --select chose); a fused
    group's measurement from `members` (every pooled record; default `runs`). Returns index entries."""
    from .outputs import reported

    statistic = reported(render)
    points = with_fronts(cost_points(runs, statistic, members))
    if points.empty:
        return [("fig_cost_*.png", "not drawn: no run with a score yet")]
    out.csv("fig_cost.csv", points)
    chosen = selected_note(render)
    entries = [("fig_cost.csv", f"the cost view's points: {statistic} test score, trainable parameters, seconds per step "
                                "and peak memory per method, task and K (avg = over the K's tasks), each cost's Pareto "
                                "front, the fused groups whose measurement a cost is" + (f". {chosen}" if chosen else ""))]
    about = f"{render.selection.model_label()}; {render.selection.protocol}"
    for cost, (name, label, _) in COSTS.items():
        measures = sorted(set(filter(None, ", ".join(points["memory_measures"].fillna("")).split(", "))))
        what = label + (f" ({'; '.join(MEASURES.get(m, m) for m in measures)})" if cost == "peak_memory_gib" and measures else "")
        bars = ("median over seeds, bars: 25th-75th percentile" if statistic == "median" else
                "mean over seeds, bars: ± 1 std")
        notes = [note for note in (fused_note(points, cost), chosen) if note]
        title = f"Test score ({bars}) against {what}\n{about}. Dashed: Pareto front; hollow: one seed."
        figure = cost_figure(points, cost, "\n".join([title, *notes]))
        if figure is None:
            entries.append((name, " ".join([f"not drawn: no record has {label}.", *notes])))
            continue
        out.figure(name, figure)
        entries.append((name, " ".join([f"test score against {what}, one point per method, per task × K and averaged.",
                                        *notes])))
    return entries


def selected_note(render):
    """With --select, what a cost figure says of its points (docs/tables.md: each shows the chosen setting)."""
    if not render.select_label:
        return ""
    return (f"Settings chosen on dev (--select {render.select_label}): each point at the value chosen for its task and "
            "K (selection.md), not the method's default.")


def fused_note(points, cost):
    """What the figure of `cost` says of fused runs ("" when its cost is every point's own): that the cost is their
    group's one measurement, drawn once, and in no Pareto decision."""
    if cost not in SHARED:
        return ""
    sizes = _all_sizes(points[SHARED[cost][0]].fillna(""))
    if not sizes:
        return ""
    measured = "seconds per step (all its runs in one step)" if cost == "seconds_per_step" else "peak"
    return (f"Fused runs (groups of {sizes.replace(', ', ' or ')}): the group's {measured}, not the run's own; one grey "
            "bar per group, its members side by side across it, left out of the Pareto front.")
