"""Tables 1-4 from synthetic result records with hand-computed values (peltbench.tables: records, scores, ...).

The synthetic set SCORES below: K = 100, tasks CoLA and RTE, three data seeds; every expected number is
worked out by hand in the comment beside it (std with ddof = 1). Other test files import `write_record`
and `write_synthetic` from here, as the suite imports from conftest.
"""
import json
import math

import pytest

from peltbench.tables.efficiency import efficiency_table
from peltbench.tables.records import default_runs, load_records, swept_runs
from peltbench.tables.scores import problem_runs, score_table, upper_bounds
from peltbench.tables.significance import significance

# method -> task -> {seed: test.main}; None = a failed run. UniPELT (APL) never ran RTE.
SCORES = {
    "ft": {"cola": {111: 18, 222: 20, 333: 22}, "rte": {111: 50, 222: 60, 333: 70}},
    "adapter": {"cola": {111: 0, 222: 2, 333: 4}, "rte": {111: 55, 222: 55, 333: 55}},
    "prefix": {"cola": {111: 0, 222: 0, 333: 0}, "rte": {111: 60, 222: 62, 333: 64}},
    "lora": {"cola": {111: 12, 222: 14, 333: None}, "rte": {111: 58, 222: 59, 333: 60}},
    "unipelt_ap": {"cola": {111: 25, 222: 26, 333: 27}, "rte": {111: 61, 222: 62, 333: 63}},
    "unipelt_apl": {"cola": {111: 40, 222: 42, 333: 44}},
}


# The paper's protocol as conf/config.yaml sets it (App. B), as a record's config carries it.
PAPER_TRAIN = {"epochs": 50, "patience": 10, "batch_size": 16, "max_length": 128, "grad_clip": 1.0, "eval_batch_size": 128}


def write_record(root, method, task, k, seed, main, variant=None, settings=None, model="bert-base-uncased",
                 train=None, dev_size=1000, precision="fp32", **fields):
    """One result.json as docs/record.md lays it out (the fields the tables read); `train` overrides train.* keys."""
    variant = variant or method
    record = {
        "schema": 1, "method": method, "variant": variant, "task": task, "k": k, "seed": seed,
        "model": model, "status": "ok" if main is not None else "failed",
        "error": None if main is not None else "RuntimeError: boom",
        "test": {"main": main}, "gates": None, "precision": precision,
        "config": {"method": {"name": method, **(settings or {})}, "task": {"name": task}, "k": k, "seed": seed,
                   "model_seed": 42, "dev_size": dev_size, "model": {"name": model},
                   "train": {**PAPER_TRAIN, **(train or {})}, "precision": "auto"},
        **fields,
    }
    folder = root / variant / task / f"k{k}" / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps(record))
    return folder / "result.json"


def write_synthetic(root, k=100):
    for method, tasks in SCORES.items():
        for task, seeds in tasks.items():
            for seed, main in seeds.items():
                write_record(root, method, task, k, seed, main)
    return root


@pytest.fixture
def table(tmp_path):
    return score_table(default_runs(load_records(write_synthetic(tmp_path))))


def cell(table, method, task, k="100"):
    cells = table.cells.set_index(["k", "method", "task"])
    return cells.loc[(k, method, task)]


def test_load_records_flattens_the_schema(tmp_path):
    write_record(tmp_path, "adapter", "cola", 100, 111, 41.5)
    write_record(tmp_path, "lora", "rte", "all", 111, None)
    records = load_records(tmp_path).set_index("method")
    assert records.loc["adapter", "k"] == "100"  # K is a string, so "all" fits the same column
    assert records.loc["adapter", "main"] == 41.5
    assert records.loc["lora", "k"] == "all"
    assert records.loc["lora", "status"] == "failed"
    assert math.isnan(records.loc["lora", "main"])  # null score of a failed run


def test_load_records_of_an_empty_dir_is_an_empty_frame(tmp_path):
    assert load_records(tmp_path).empty


def test_settings_come_from_config_not_folder_names(tmp_path):
    # a non-default model changes only the folder name (as the runner names it): still a Table 1 run
    write_record(tmp_path, "adapter", "cola", 100, 111, 40.0, variant="adapter,model.name=tiny")
    # bottleneck 256 differs from conf/method/adapter.yaml (48): a Figure 2 run, not a Table 1 run
    write_record(tmp_path, "adapter", "cola", 100, 222, 30.0, variant="adapter,bottleneck=256", settings={"bottleneck": 256})
    records = load_records(tmp_path)
    assert sorted(records["changed"]) == [(), ("bottleneck",)]
    assert default_runs(records)["seed"].tolist() == [111]
    swept = swept_runs(records, "adapter", "bottleneck")
    assert sorted(swept["value"]) == [48, 256]  # 48: the default, read from conf/method/adapter.yaml


def test_cells_are_mean_and_std_over_seeds(table):
    assert cell(table, "ft", "cola")[["mean", "std", "n"]].tolist() == [20, 2, 3]       # 18, 20, 22
    assert cell(table, "ft", "rte")[["mean", "std", "n"]].tolist() == [60, 10, 3]       # 50, 60, 70
    assert cell(table, "adapter", "rte")[["mean", "std"]].tolist() == [55, 0]           # constant
    lora = cell(table, "lora", "cola")                                                  # 12, 14 and a failed run
    assert (lora["mean"], lora["n"], lora["failed"]) == (13, 2, 1)
    assert lora["std"] == pytest.approx(math.sqrt(2))                                   # |14 - 12| / sqrt(2)


def test_avg_is_mean_and_std_of_per_seed_averages(table):
    # ft per seed: (18+50)/2 = 34, (20+60)/2 = 40, (22+70)/2 = 46 -> mean 40, std 6 (not the mean of cell stds)
    assert cell(table, "ft", "avg")[["mean", "std", "n"]].tolist() == [40, 6, 3]
    # UniPELT (AP): 43, 44, 45
    assert cell(table, "unipelt_ap", "avg")[["mean", "std", "n"]].tolist() == [44, 1, 3]
    # LoRA: seed 333 failed on CoLA, so only seeds 111 and 222 have every task: 35 and 36.5
    lora = cell(table, "lora", "avg")
    assert (lora["mean"], lora["n"]) == (35.75, 2)
    assert lora["std"] == pytest.approx(1.0606601717798212)                            # 1.5 / sqrt(2)


def test_a_missing_task_leaves_the_cell_and_avg_empty(table):
    assert cell(table, "unipelt_apl", "rte")["n"] == 0          # APL never ran RTE
    assert math.isnan(cell(table, "unipelt_apl", "rte")["mean"])
    assert math.isnan(cell(table, "unipelt_apl", "avg")["mean"])  # no seed has both tasks
    assert table.tasks == ("cola", "rte")                          # the paper's column order: CoLA before RTE


def test_best_and_second_per_column(table):
    ranks = table.cells.dropna(subset=["rank"]).set_index(["method", "task"])["rank"]
    best = sorted(index for index, rank in ranks.items() if rank == 1)
    second = sorted(index for index, rank in ranks.items() if rank == 2)
    # CoLA: APL 42 > AP 26; RTE: prefix and AP tie at 62 (both bold, as the paper does), then ft 60;
    # Avg.: AP 44 > ft 40 (APL has no Avg.)
    assert best == [("prefix", "rte"), ("unipelt_ap", "avg"), ("unipelt_ap", "rte"), ("unipelt_apl", "cola")]
    assert second == [("ft", "avg"), ("ft", "rte"), ("unipelt_ap", "cola")]


def test_failed_and_undefined_runs_are_listed_not_averaged(tmp_path):
    write_record(tmp_path, "lora", "cola", 100, 333, None)
    write_record(tmp_path, "ft", "stsb", 100, 111, None, status="ok", error=None)  # ok, Spearman undefined
    problems = problem_runs(load_records(tmp_path))
    assert problems[["method", "task", "seed", "status"]].values.tolist() == [
        ["ft", "stsb", 111, "ok"], ["lora", "cola", 333, "failed"]]  # paper order: ft before LoRA
    assert problems["reason"].tolist() == ["score undefined (test.main is null)", "RuntimeError: boom"]


def test_upper_bound_is_the_average_of_per_task_best_submodule(table):
    bounds = upper_bounds(table.cells).loc["100"]
    assert bounds["upper_ap"] == 32      # max(A, P): CoLA max(2, 0) = 2, RTE max(55, 62) = 62 -> 32
    assert bounds["unipelt_ap"] == 44    # (26 + 62) / 2
    assert bounds["upper_apl"] == 37.5   # max(A, P, L): CoLA max(2, 0, 13) = 13, RTE 62 -> 37.5
    assert math.isnan(bounds["unipelt_apl"])  # APL has no RTE: no partial average


def test_significance_against_the_best_single_method(table):
    results = significance(table).set_index(["method", "task"])
    # CoLA: best single is ft (20); RTE: prefix (62); Avg.: ft (40). APL has no RTE and no Avg.
    assert results["best_single"].to_dict() == {
        ("unipelt_ap", "cola"): "ft", ("unipelt_ap", "rte"): "prefix", ("unipelt_ap", "avg"): "ft",
        ("unipelt_apl", "cola"): "ft"}
    # p-values: scipy.stats.ttest_rel(a, b), paired by seed 111, 222, 333, computed once by hand
    assert results["p_value"].to_dict() == pytest.approx({
        ("unipelt_ap", "cola"): 0.009132611386275455,   # [25, 26, 27] vs [18, 20, 22]
        ("unipelt_ap", "rte"): 1.0,                     # [61, 62, 63] vs [60, 62, 64]
        ("unipelt_ap", "avg"): 0.3001457877762349,      # [43, 44, 45] vs [34, 40, 46]
        ("unipelt_apl", "cola"): float("nan")}, nan_ok=True)  # [40, 42, 44] vs [18, 20, 22]: always +22, no variance
    assert set(results["test"]) == {"paired"} and set(results["sign_flip_floor"]) == {0.25}  # 2 / 2^3
    assert results["significant"].to_dict() == {
        ("unipelt_ap", "cola"): True, ("unipelt_ap", "rte"): False, ("unipelt_ap", "avg"): False,
        ("unipelt_apl", "cola"): False}


def test_no_test_with_fewer_than_two_seeds(tmp_path):
    write_record(tmp_path, "adapter", "rte", 100, 111, 50.0)
    write_record(tmp_path, "unipelt_ap", "rte", 100, 111, 60.0)
    write_record(tmp_path, "unipelt_ap", "rte", 100, 222, 61.0)
    results = significance(score_table(load_records(tmp_path)))
    assert results["p_value"].isna().all()   # one adapter seed: n/a
    assert not results["significant"].any()


def test_efficiency_ratios_are_per_setup_then_averaged(tmp_path):
    # per step: ft 1 s on CoLA, 2 s on RTE; adapter 0.5 s and 1.2 s -> ratios 0.5 and 0.6 -> 55%
    # (the ratio of summed times would be 1.7 / 3 = 57%). Per test example: 0.01 s vs 0.0107 s -> 107%.
    timings = {("ft", "cola"): (100, 10.0), ("ft", "rte"): (200, 10.0),
               ("adapter", "cola"): (50, 10.7), ("adapter", "rte"): (120, 10.7)}
    params = {"ft": 109482240, "adapter": 894528}  # METHODS.md's counts
    for (method, task), (train_seconds, test_seconds) in timings.items():
        write_record(tmp_path, method, task, 100, 111, 50.0, train_seconds=train_seconds, train_steps=100,
                     test_seconds=test_seconds, test_examples=1000,
                     trainable_params=params[method], backbone_params=109482240)
    table = efficiency_table(default_runs(load_records(tmp_path)))
    assert table.index.tolist() == ["ft", "adapter"]  # Table 4's order
    assert table.loc["adapter", "train_time_percent"] == pytest.approx(55)
    assert table.loc["adapter", "inference_time_percent"] == pytest.approx(107)
    assert table.loc["ft", "train_time_percent"] == 100
    assert table.loc["adapter", "params_percent"] == pytest.approx(0.8170531)  # 100 × 894,528 / 109,482,240
    assert table.loc["adapter", "setups"] == 2
