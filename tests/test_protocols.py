"""Study protocols (conf/protocol/, docs/protocol.md §10): LM-BFF's split row for row, GLUE dev halves, a run under
each protocol on the tiny model, step-based evaluation, the protocol in records and in their identity, sweeps'
default seeds, and tables that never pool two protocols and report each one's statistic."""

from __future__ import annotations

import re
import csv
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import SHARED_GLUE, SHIPPED_GLUE, compose_config, tiny_run_overrides

PROTOCOLS = ("full_halves", "full_mean", "full_median", "lmbff", "unipelt")  # conf/protocol/, sorted


# ---------------------------------------------------------------- LM-BFF's split, against the script's own loop

def script_split(path: Path, task: str, k: int, seed: int) -> tuple[list[str], list[str]]:
    """An independent re-implementation of princeton-nlp/LM-BFF tools/generate_k_shot_data.py's loop (on lines,
    with the global numpy generator, as the script does): the lines it writes to train.tsv and dev.tsv."""
    with open(path) as handle:
        lines = handle.readlines()
    for loop_seed in (100, 13, 21, 42, 87):  # the script's default --seed list, its outer loop
        train_lines = lines if task == "CoLA" else lines[1:]  # split_header: CoLA's list itself, else a fresh slice
        np.random.seed(loop_seed)
        np.random.shuffle(train_lines)
        if loop_seed == seed:
            break

    def get_label(line):
        line = line.strip().split("\t")
        if task == "CoLA":
            return line[1]
        if task == "STS-B":
            return 0 if float(line[-1]) < 2.5 else 1
        return line[0] if task == "MRPC" else line[-1]
    label_list = {}
    for line in train_lines:
        label_list.setdefault(get_label(line), []).append(line)
    train = [line for label in label_list for line in label_list[label][:k]]
    dev = [line for label in label_list for line in label_list[label][k : k * 2]]
    return train, dev


def our_split(glue: Path, task_name: str, folder: str, k: int, seed: int) -> tuple[list[str], list[str], np.ndarray]:
    from peltbench.data import lmbff_chain, lmbff_split, load_split
    from peltbench.tasks import TaskSpec

    task = TaskSpec.from_config(compose_config("method=lora", f"task={task_name}").task)
    split = load_split(task, str(glue), "train")
    train, dev = lmbff_split(split.labels, k, seed, task.lmbff_threshold, lmbff_chain(seed, task.lmbff_chained))
    lines = (glue / folder / "train.tsv").read_text().splitlines(keepends=True)
    data = lines if folder == "CoLA" else lines[1:]
    return [data[i] for i in train], [data[i] for i in dev], split.labels


@pytest.mark.parametrize("seed", [13, 42])
def test_the_lmbff_split_is_the_scripts_rows_on_the_shipped_rte(seed):
    train, dev, labels = our_split(SHIPPED_GLUE, "rte", "RTE", 16, seed)
    expected_train, expected_dev = script_split(SHIPPED_GLUE / "RTE" / "train.tsv", "RTE", 16, seed)
    assert train == expected_train and dev == expected_dev  # the same rows, in the same order
    assert len(train) == len(dev) == 32 and not set(train) & set(dev)
    for rows in (train, dev):  # 16 per class (RTE's labels are the last column)
        counts = {}
        for line in rows:
            counts[line.rstrip("\n").split("\t")[-1]] = counts.get(line.rstrip("\n").split("\t")[-1], 0) + 1
        assert counts == {"entailment": 16, "not_entailment": 16}


@pytest.mark.skipif(not SHARED_GLUE.is_dir(), reason="../shared/data/glue is not beside this clone")
@pytest.mark.parametrize(("task", "folder"), [("stsb", "STS-B"), ("cola", "CoLA"), ("mrpc", "MRPC")])
def test_the_lmbff_split_is_the_scripts_rows_on_real_files(task, folder):
    train, dev, labels = our_split(SHARED_GLUE, task, folder, 16, 21)
    expected_train, expected_dev = script_split(SHARED_GLUE / folder / "train.tsv", folder, 16, 21)
    assert train == expected_train and dev == expected_dev
    assert len(train) == len(dev) == 32 and not set(train) & set(dev)


def test_stsb_is_classed_at_2_5_for_sampling_only():
    from peltbench.data import lmbff_split

    scores = np.array([2.5, 0.0, 2.49, 5.0, 1.0, 3.0, 2.4, 4.0], dtype=np.float32)  # 2.5 goes with the high class
    train, dev = lmbff_split(scores, 2, seed=0, threshold=2.5)
    order = list(range(8))
    np.random.RandomState(0).shuffle(order)
    high = [row for row in order if scores[row] >= 2.5]
    low = [row for row in order if scores[row] < 2.5]
    first, second = (high, low) if scores[order[0]] >= 2.5 else (low, high)  # classes in order of first appearance
    assert train.tolist() == first[:2] + second[:2] and dev.tolist() == first[2:4] + second[2:4]


def test_a_class_too_small_for_k_train_and_k_dev_rows_is_one_line():
    from peltbench import UserError
    from peltbench.data import lmbff_split

    with pytest.raises(UserError, match=r"k=4: LM-BFF's split takes 2K = 8 train rows of each class .* has 5"):
        lmbff_split(np.array([0] * 20 + [1] * 5), 4, seed=13)


def test_glue_dev_halves_are_disjoint_and_sized_as_pyreft():
    from peltbench.data import dev_halves

    selection, test = dev_halves(277, seed=42)  # RTE's dev: half (n // 2 = 138) selects, 139 reported
    assert (len(selection), len(test)) == (138, 139)
    assert sorted(selection.tolist() + test.tolist()) == list(range(277))
    selection, test = dev_halves(9815, seed=42)  # MNLI matched: over 5,000 rows, 1,000 select
    assert (len(selection), len(test)) == (1000, 8815)
    assert dev_halves(277, seed=43)[0].tolist() != dev_halves(277, seed=42)[0].tolist()


# ---------------------------------------------------------------- the protocol files

@pytest.mark.parametrize("name", PROTOCOLS)
def test_each_protocol_file_agrees_with_itself(name):
    from peltbench.packaged import options, packaged_config
    from peltbench.protocols import method_overrides, protocol_settings, sweep_seeds

    assert tuple(options("protocol")) == PROTOCOLS
    settings = protocol_settings(name)
    if name == "unipelt":  # today's behaviour: it sets nothing the other files do not, and no -m seeds
        assert set(packaged_config("protocol/unipelt.yaml").keys()) == {"protocol"} and sweep_seeds(name) is None
        return
    assert sweep_seeds(name) == ",".join(map(str, settings["seeds"]))
    assert method_overrides(name) == {"head": settings["head"]} == {"head": "train"}
    cfg = compose_config(f"protocol={name}", "method=prefix", "task=rte")
    assert cfg.seed == settings["seeds"][0] and cfg.model_seed == cfg.seed and cfg.method.head == "train"


def test_unipelt_composes_as_before_protocols():
    cfg = compose_config("method=lora", "task=rte")
    assert cfg.protocol.name == "unipelt" and cfg.method.head == "frozen" and cfg.model_seed == 42
    assert (cfg.k, cfg.seed, cfg.train.epochs, cfg.train.patience, cfg.train.max_steps) == (100, 111, 50, 10, None)


@pytest.mark.parametrize(("overrides", "message"), [
    (["protocol=full_median", "k=100"], "k=100: protocol=full_median trains on the whole train split (k=all)"),
    (["protocol=lmbff", "k=all"], "k=all: protocol=lmbff samples K train rows per class"),
    (["train.epochs=null"], "train.epochs=null train.max_steps=null: give exactly one"),
    (["train.epochs=null", "train.max_steps=100"], "dev evaluation every N steps goes with training for a number"),
    (["protocol=lmbff", "train.max_steps=150"], "train.max_steps=150 must be a multiple of train.eval_every=100"),
    (["protocol=lmbff", "protocol.statistic=mode"], "protocol.statistic=mode: must be one of mean, median"),
])
def test_a_protocol_config_that_cannot_be_is_one_line(overrides, message):
    from peltbench import UserError
    from peltbench.config import check_config

    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_config(compose_config("method=lora", "task=rte", *overrides))


def test_a_bad_protocol_name_lists_the_valid_ones():
    from peltbench.cli import preflight
    from peltbench import UserError

    with pytest.raises(UserError) as error:
        preflight(["protocol=lmbf", "method=lora", "task=rte"])
    assert str(error.value) == ("Could not find 'protocol/lmbf'; Available options in 'protocol': "
                                + ", ".join(PROTOCOLS))


def test_a_single_run_of_a_protocol_is_not_a_sweep_but_its_sweep_runs_its_seeds():
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from peltbench.cli import preflight
    from peltbench.missing import expand

    preflight(["protocol=lmbff", "method=lora", "task=rte", f"data.dir={SHIPPED_GLUE}"])  # no "this is a sweep"
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration("config", ["protocol=lmbff", "method=lora", "task=rte"], RunMode.MULTIRUN)
        jobs, _ = expand(loader, config)
        assert [seed_of(job) for job in jobs] == ["13", "21", "42", "87", "100"]  # run_experiment.sh's SEEDs
        config = loader.load_configuration("config", ["protocol=lmbff", "method=lora", "task=rte", "seed=21"],
                                           RunMode.MULTIRUN)
        assert [seed_of(job) for job in expand(loader, config)[0]] == ["21"]  # the command line's seed wins


def seed_of(job: list[str]) -> str:
    return dict(override.split("=", 1) for override in job)["seed"]


# ---------------------------------------------------------------- identity and folder

def test_the_protocol_names_the_folder_and_enters_the_identity_only_when_it_is_not_unipelt():
    from peltbench.record import config_hash, record_path, semantic_config

    unipelt = compose_config("method=lora", "task=rte")
    assert "protocol" not in semantic_config(unipelt)  # tests/test_bert_unchanged.py pins its hashes
    assert str(record_path(unipelt, Path("R"))) == "R/lora/rte/k100/seed111/result.json"
    lmbff = compose_config("protocol=lmbff", "method=lora", "task=rte")
    assert semantic_config(lmbff)["protocol"] == {"name": "lmbff", "k": "per_class", "dev": "per_class"}
    assert str(record_path(lmbff, Path("R"))) == "R/lora,protocol=lmbff/rte/k16/seed13/result.json"
    departing = compose_config("protocol=lmbff", "method=lora", "task=rte", "seed=21", "method.head=frozen",
                               "train.batch_size=16")
    assert str(record_path(departing, Path("R"))) == ("R/lora,head=frozen,train.batch_size=16,protocol=lmbff/rte/k16/"
                                                      "seed21/result.json")
    same_settings = compose_config("method=lora", "task=rte", "k=16", "seed=13", "model_seed=13", "method.head=train",
                                   "train.epochs=null", "train.max_steps=1000", "train.eval_every=100",
                                   "train.patience=null", "train.batch_size=8")
    assert config_hash(same_settings) != config_hash(lmbff)  # another split: K per class, dev per class


# ---------------------------------------------------------------- runs on the tiny model

def _run(tiny_checkpoint, glue_dir, tmp_path, *overrides):
    from peltbench.runner import run_experiment

    # the protocols here take no dev_size (their dev rows are per class or GLUE dev's): giving one is refused
    base = [o for o in tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path) if not o.startswith(("k=", "train.", "dev_size="))]
    return run_experiment(compose_config("method=lora", "task=rte", "logger=[]", "device=cpu", *base, *overrides))


def test_an_lmbff_run_trains_in_steps_and_evaluates_every_n_steps(tiny_checkpoint, glue_dir, tmp_path):
    record = _run(tiny_checkpoint, glue_dir, tmp_path, "protocol=lmbff", "k=8", "train.max_steps=9",
                  "train.eval_every=3", "seed=21")  # 16 rows, batch 8: 2 steps an epoch, so periods cross epochs
    assert record["protocol"] == "lmbff" and record["config"]["protocol"]["name"] == "lmbff"
    assert [entry["step"] for entry in record["history"]] == [3, 6, 9]  # dev every 3 steps, no early stopping
    assert record["train_steps"] == 9 and record["best_step"] in (3, 6, 9) and record["best_epoch"] is None
    best = max(range(3), key=lambda i: (record["history"][i]["dev_main"], -i))  # the first of equal best scores
    assert record["best_step"] == record["history"][best]["step"]
    train, dev = record["split"]["train_indices"], record["split"]["dev_indices"]
    from peltbench.data import lmbff_split, load_split
    from peltbench.tasks import TaskSpec

    labels = load_split(TaskSpec.from_config(OmegaConf.create(record["config"]["task"])), str(glue_dir), "train").labels
    assert (train, dev) == tuple(rows.tolist() for rows in lmbff_split(labels, 8, 21))  # the data seed's rows
    assert np.bincount(labels[train]).tolist() == np.bincount(labels[dev]).tolist() == [8, 8] and not set(train) & set(dev)
    assert record["config"]["model_seed"] == 21 and record["config"]["method"]["head"] == "train"
    assert record["variant"] == ("lora,model.name=" + record["variant"].split("model.name=")[1].split(",")[0]
                                 + ",train.max_steps=9,train.eval_every=3,protocol=lmbff")  # what departs from lmbff


def test_step_periods_see_each_epoch_as_one_permutation_in_the_order_epochs_draw():
    import torch

    from peltbench.train import Member, TrainSettings, _DataOrder

    member = Member("m", train=list(range(10)), dev=None, test=None, settings=TrainSettings(lr=1.0, seed=7))
    order = _DataOrder([member], steps_per_epoch=3)  # 10 rows, batch 4: 4 + 4 + 2
    seen = [order.rows(0, step, 4) for step in range(6)]  # read in periods of any length: steps are what count
    generator = torch.Generator().manual_seed(7)  # what the epoch loop drew before steps existed
    first, second = (torch.randperm(10, generator=generator).tolist() for _ in range(2))
    assert seen == [first[:4], first[4:8], first[8:], second[:4], second[4:8], second[8:]]


@pytest.mark.parametrize("name", ["full_median", "full_mean", "full_halves"])
def test_a_full_data_run_selects_and_reports_as_its_protocol_says(name, tiny_checkpoint, glue_dir, tmp_path):
    record = _run(tiny_checkpoint, glue_dir, tmp_path, f"protocol={name}", "train.epochs=2", "save.predictions=true")
    assert record["protocol"] == name and record["k"] == "all" and record["epochs_run"] == 2  # patience null: all
    assert record["split"]["train_indices"] is None and record["split"]["dev_indices"] is None
    predictions = list(csv.DictReader(open(Path(tmp_path) / record["variant"] / "rte" / "kall" / f"seed{record['seed']}"
                                           / "predictions.csv")))
    if name == "full_halves":  # 24 GLUE dev rows: 12 select, the other 12 are the test set
        selection, test = record["split"]["glue_dev_selection"], record["split"]["glue_dev_test"]
        assert len(selection) == len(test) == 12 and sorted(selection + test) == list(range(24))
        assert record["test_examples"] == 12 and [int(row["index"]) for row in predictions] == test
    else:  # selection on the reported set: the best epoch's dev scores are its test scores
        assert record["test_examples"] == 24 and record["test"] == record["dev_best"]
        assert [int(row["index"]) for row in predictions] == list(range(24))


# ---------------------------------------------------------------- tables

def _record(root: Path, protocol: str | None, seed: int, main: float) -> None:
    config = {"method": {"name": "lora"}, "task": {"name": "rte"}, "k": 16, "seed": seed, "model_seed": 42,
              "dev_size": 1000, "model": {"name": "bert-base-uncased"},
              "train": {"epochs": 50, "patience": 10, "batch_size": 16, "max_length": 128, "grad_clip": 1.0}}
    if protocol is not None:
        defaults = OmegaConf.to_container(compose_config(f"protocol={protocol}", "method=lora", "task=rte",
                                                         f"seed={seed}"), resolve=True)
        config = {**config, **{key: defaults[key] for key in ("protocol", "train", "model_seed", "method")}}
    folder = root / (protocol or "unipelt") / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({
        "method": "lora", "task": "rte", "k": 16, "seed": seed, "model": "bert-base-uncased", "status": "ok",
        "test": {"main": main}, "precision": "fp32", "config": config}))


def test_tables_never_pool_two_protocols_and_report_each_ones_statistic(tmp_path):
    from peltbench.protocols import statistic
    from peltbench.tables.comparability import label_protocol, pooled, select
    from peltbench.tables.records import default_runs, load_records
    from peltbench.tables.scores import score_table

    for seed, main in zip((111, 222, 333), (60.0, 70.0, 90.0)):
        _record(tmp_path, None, seed, main)          # a record from before protocols: unipelt
    for seed, main in zip((13, 21, 42), (50.0, 52.0, 80.0)):
        _record(tmp_path, "lmbff", seed, main)
    for seed, main in zip((0, 1, 2), (10.0, 20.0, 90.0)):
        _record(tmp_path, "full_median", seed, main)
    records = load_records(tmp_path)
    assert sorted(set(records["protocol"])) == ["precision=fp32", "protocol=full_median,precision=fp32",
                                                "protocol=lmbff,precision=fp32"]
    assert records["changed"].map(len).sum() == 0  # lmbff's head=train and seed-following model seed are its own
    for option, seeds, reported, cell in ((None, {111, 222, 333}, "mean", 73.33), ("protocol=lmbff", {13, 21, 42}, "mean", 60.67),
                                          ("protocol=full_median", {0, 1, 2}, "median", 20.0)):
        selection = select(records, protocol=option)
        runs = records[pooled(records, selection)]
        assert set(runs["seed"]) == seeds  # one protocol per render
        assert statistic(label_protocol(selection.protocol)) == reported
        cells = score_table(default_runs(runs), reported=reported).cells
        rte = cells[cells["task"] == "rte"].iloc[0]
        assert round(float(rte["median"] if reported == "median" else rte["mean"]), 2) == cell


def test_the_statistic_follows_the_protocol():
    from peltbench.protocols import statistic
    from peltbench.tables.formatting import center, spread
    from peltbench.tables.markdown import score_cell

    assert [statistic(name) for name in PROTOCOLS] == ["mean", "mean", "median", "mean", "mean"]
    assert statistic(None) == "mean" and statistic("from_a_later_version") == "mean"

    class Cell:  # a Table 1 cell of three seeds, 10, 20, 90
        mean, std, median, n, rank = 40.0, 43.589, 20.0, 3, 0
    median_cell, mean_cell = Cell(), Cell()
    median_cell.statistic, mean_cell.statistic = "median", "mean"
    assert (center(median_cell), spread(median_cell)) == (20.0, None)
    assert score_cell(median_cell, 3) == "20.00" and score_cell(mean_cell, 3) == "40.00 ± 43.59"


# ---------------------------------------------------------------- a protocol's settings are its own (issue 25 item 4)

@pytest.mark.parametrize("overrides,message", [
    (("protocol.name=lmbff",), "protocol.name=lmbff with protocol.k=total: protocol lmbff has k=per_class"),
    (("protocol=lmbff", "dev_size=100"), "dev_size=100: protocol=lmbff does not use it"),
    (("protocol=full_median", "k=all", "dev_size=100"), "dev_size=100: protocol=full_median does not use it"),
])
def test_a_protocol_name_or_setting_that_disagrees_is_one_line(overrides, message):
    from peltbench import UserError
    from peltbench.config import check_config

    with pytest.raises(UserError, match=re.escape(message)):
        check_config(compose_config("method=lora", "task=rte", *overrides))
    check_config(compose_config("method=lora", "task=rte", *overrides[:1]) if overrides[0] != "protocol.name=lmbff"
                 else compose_config("method=lora", "task=rte", "protocol=lmbff"))


def test_a_sweep_of_several_protocols_without_seeds_is_refused_saying_how():
    from peltbench import UserError
    from peltbench.cli import check_protocol_sweep

    with pytest.raises(UserError, match=r"lmbff: seed=13,21,42,87,100; unipelt: seed=111\); sweep one protocol at a "
                                        r"time, e.g. `peltbench -m protocol=lmbff method=lora`"):
        check_protocol_sweep(["lmbff", "unipelt"], ["protocol=unipelt,lmbff", "method=lora"])
    check_protocol_sweep(["lmbff", "unipelt"], ["protocol=unipelt,lmbff", "seed=13,21"])  # seeds given: the user's
    check_protocol_sweep(["lmbff"], ["protocol=lmbff"])


def test_lmbff_runs_rte_and_mnli_at_256_tokens_as_run_experiment_sh_without_a_folder_of_their_own():
    """conf/protocol_task/lmbff_{rte,mnli}.yaml: LM-BFF's --max_seq_length 256 there, 128 elsewhere and under unipelt;
    the preset's value is not a departure (no `train.max_length=` in the folder), a given one still wins."""
    from peltbench.record import variant_name

    rte = compose_config("method=lora", "task=rte", "protocol=lmbff")
    assert rte.train.max_length == 256 and compose_config("method=lora", "task=mnli", "protocol=lmbff").train.max_length == 256
    assert compose_config("method=lora", "task=sst2", "protocol=lmbff").train.max_length == 128
    assert compose_config("method=lora", "task=rte").train.max_length == 128
    assert variant_name(rte) == "lora,protocol=lmbff"
    given = compose_config("method=lora", "task=rte", "protocol=lmbff", "train.max_length=128")
    assert given.train.max_length == 128 and variant_name(given) == "lora,train.max_length=128,protocol=lmbff"


def test_lmbff_selects_and_reports_stsb_on_pearson_as_another_identity():
    """conf/protocol_task/lmbff_stsb.yaml: LM-BFF's dev objective for STS-B is Pearson; such a run is another run than
    one selected on Spearman (its identity names the metric), and every other record keeps its hash."""
    from peltbench.record import semantic_config

    lmbff = compose_config("method=lora", "task=stsb", "protocol=lmbff")
    assert lmbff.task.main_metric == "pearson" and semantic_config(lmbff)["task.main_metric"] == "pearson"
    assert compose_config("method=lora", "task=stsb").task.main_metric == "spearman"
    for task in ("stsb", "rte", "cola"):
        assert "task.main_metric" not in semantic_config(compose_config("method=lora", f"task={task}"))
    assert "task.main_metric" not in semantic_config(compose_config("method=lora", "task=rte", "protocol=lmbff"))
