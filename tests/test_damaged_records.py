"""One reading of a record everywhere (issue 40 item 4, issue 48 item 1): record.damage is the one validation of a
record (its fields and their types; its fields, config, identity and hash agreeing), and the rerun (check_existing),
peltbench-missing, a sweep (its launcher and summary) and the tables each take a damaged record as damaged, with the
same reason; none takes it as done or as a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHIPPED_GLUE, compose_config

from peltbench import record as record_module
from peltbench.missing import main as missing
from peltbench.record import (DamagedRecord, check_existing, config_hash, damage, format_record, identity_hash, record_path,
                              semantic_config)
from peltbench.runner import _identity
from peltbench.tables.command import main as tables
from peltbench.tables.records import Skipped, read_records

RUN = ["method=lora", "task=rte", "k=100", "seed=111", f"data.dir={SHIPPED_GLUE}"]


def written(results: Path, edit=None) -> Path:
    """The record today's code writes for RUN (scores made up), with `edit` applied to it as a hand would."""
    cfg = compose_config(*RUN, f"results_dir={results}")
    record = {**_identity(cfg, config_hash(cfg)), "status": "ok", "test": {"accuracy": 61.0, "main": 61.0},
              "dev_best": {"accuracy": 60.0, "main": 60.0}, "best_epoch": 3, "epochs_run": 13}
    if edit is not None:
        edit(record)
    path = record_path(cfg, results)
    path.parent.mkdir(parents=True)
    path.write_text(format_record(record))
    return path


def hand_edited(record: dict) -> None:
    """What issue 40 found: the identity's LoRA rank and max length changed, config and config_hash left alone."""
    record["identity"]["method"]["lora_rank"] = 16
    record["identity"]["train.max_length"] = 256


def lr_edited(record: dict) -> None:
    """Issue 48: `config.method.lr` edited, identity and config_hash left alone."""
    record["config"]["method"]["lr"] = 0.001


def lr_edited_identity_removed(record: dict) -> None:
    lr_edited(record)
    del record["identity"]


# (name, edit, the reason every reader gives; {hash}: the record's config_hash, {identity}: its identity's hash)
CASES = [
    ("identity edited", hand_edited,
     "its identity hashes to {identity}, not to its config_hash {hash} (edited after it was written?)"),
    ("config edited", lr_edited,
     "its config says method.lr 0.001 where its identity has 0.0005 (edited after it was written?)"),
    ("config edited, identity removed", lr_edited_identity_removed,
     "its config hashes to {config}, not to its config_hash {hash} (edited after it was written?)"),
    ("seed a string", lambda record: record.update(seed="111"), "field 'seed' is \"111\", expected an integer"),
    ("scores as strings", lambda record: record.update(test={"accuracy": "61.0", "main": "61.0"}),
     "field 'test' is {\"accuracy\": \"61.0\", \"main\": \"61.0\"}, expected {metric: number or null}"),
    ("status finished", lambda record: record.update(status="finished"),
     "field 'status' is \"finished\", expected \"ok\", \"failed\" or \"pruned\""),
    ("seed another run's", lambda record: record.update(seed=222),
     "its field 'seed' is 222 where its config has 111 (edited after it was written?)"),
    ("identity not an object", lambda record: record.update(identity="lora"),
     "field 'identity' is \"lora\", expected an object"),
]


def reason(path: Path, template: str) -> str:
    record = json.loads(path.read_text())
    identity = record.get("identity")
    values = {"{hash}": record.get("config_hash"), "{config}": identity_hash(semantic_config(record["config"])),
              "{identity}": identity_hash(identity) if isinstance(identity, dict) else None}
    for key, value in values.items():
        template = template.replace(key, str(value))
    return template


def test_a_record_as_written_is_not_damaged(tmp_path, in_process, capsys, monkeypatch):
    path = written(tmp_path / "results")
    record = json.loads(path.read_text())
    assert identity_hash(record["identity"]) == record["config_hash"] and damage(record) is None
    assert in_process(*RUN, "results_dir=results", cwd=tmp_path).returncode == 0  # done: skipped
    examined = []  # a sweep's plan reads its run's own record against its config as data: its identity found once
    examine = record_module.examine
    monkeypatch.setattr(record_module, "examine", lambda record, meaning=True, from_config=None:
                        examined.append(from_config) or examine(record, meaning, from_config))
    assert missing([*RUN, f"results_dir={tmp_path / 'results'}"]) == 0
    assert examined == [record["identity"]]
    assert capsys.readouterr().out.splitlines()[0] == "1 runs: 1 done, 0 failed, 0 missing"
    records, skipped = read_records(tmp_path / "results")
    assert len(records) == 1 and skipped == []


@pytest.mark.parametrize("name, edit, why", CASES, ids=[case[0] for case in CASES])
def test_a_damaged_record_is_damaged_for_every_reader_with_one_reason(tmp_path, capsys, name, edit, why):
    results = tmp_path / "results"
    path = written(results, edit)
    text = path.read_text()
    why = reason(path, why)
    assert damage(json.loads(text)) == why

    with pytest.raises(DamagedRecord) as error:  # the rerun (runner: check_existing) stops at it, in one line
        check_existing(path, compose_config(*RUN, f"results_dir={results}"))
    assert str(error.value) == f"{path} holds a damaged record: {why}; move it away to rerun it"

    assert missing([*RUN, f"results_dir={results}"]) == 1  # not done, and not in the commands to run
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 runs: 0 done, 0 failed, 0 missing, 1 damaged"
    assert out[1:] == [f"  damaged  {path}: {why}; move it away to rerun it"]

    records, skipped = read_records(results)  # the tables leave it out, as damaged, saying why
    assert records.empty
    assert skipped == [Skipped(str(path), "damaged", f"{why}; move it away to rerun it")]
    assert path.read_text() == text


def test_the_rerun_and_the_tables_say_damaged_in_their_own_lines(tmp_path, in_process, capsys):
    path = written(tmp_path / "results", lr_edited)
    why = "its config says method.lr 0.001 where its identity has 0.0005 (edited after it was written?)"

    rerun = in_process(*RUN, "results_dir=results", cwd=tmp_path)
    assert rerun.returncode == 2
    assert rerun.stderr == f"peltbench: error: {path} holds a damaged record: {why}; move it away to rerun it\n"

    other = tmp_path / "results" / "lora" / "rte" / "k100" / "seed222"  # a good record beside it
    good = json.loads(path.read_text())
    good["config"]["method"]["lr"] = 0.0005
    good.update(seed=222, config={**good["config"], "seed": 222})
    good["identity"]["seed"] = 222
    good["config_hash"] = identity_hash(good["identity"])
    other.mkdir(parents=True)
    (other / "result.json").write_text(format_record(good))
    capsys.readouterr()
    assert tables(["--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "tables")]) == 0
    captured = capsys.readouterr()
    assert f"peltbench-tables: damaged record, skipped: {path}: {why}; move it away to rerun it" in captured.err
    assert "unreadable" not in captured.err + captured.out
    assert "1 records: 1 in the tables" in captured.out and "; 1 damaged record skipped" in captured.out
    ledger = (tmp_path / "tables" / "other_runs.md").read_text()
    assert f"## Damaged records (skipped)\n\n- `{path}`: {why}; move it away to rerun it\n" in ledger


def test_a_sweep_gives_a_damaged_run_no_job_and_names_it_damaged(tmp_path, in_process):
    path = written(tmp_path / "results", lambda record: record.update(seed="111"))
    why = "field 'seed' is \"111\", expected an integer"
    sweep = in_process("-m", *RUN, "results_dir=results", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert sweep.returncode == 1
    log = sweep.stdout + sweep.stderr
    assert "1 runs: 1 damaged (skipped: the summary names them), 0 to train" in log
    assert "run 1 of 1 done (1 damaged)" in log and "bad input" not in log
    assert f"peltbench sweep: 1 runs: 0 done (0 of them skipped as already done), 0 failed, 0 missing, 1 damaged" in log
    assert f"  damaged  {path}: {why}; move it away to rerun it" in log


def test_records_from_before_identity_keep_their_reading(tmp_path):
    path = written(tmp_path, lambda record: record.pop("identity"))
    assert damage(json.loads(path.read_text())) is None
    assert len(read_records(tmp_path)[0]) == 1


def test_a_file_that_is_not_a_record_is_missing_for_a_sweep_and_unreadable_for_the_tables(tmp_path, capsys):
    path = written(tmp_path / "results")
    path.write_text('{"status": "ok", "conf')
    assert missing([*RUN, f"results_dir={tmp_path / 'results'}"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 runs: 0 done, 0 failed, 1 missing"
    why = "not valid JSON: Unterminated string starting at at line 1 column 18 (truncated?)"
    assert out[1] == f"  missing  lora/rte/k100/seed111: its result.json is not a record ({why}): a rerun replaces it"
    assert read_records(tmp_path / "results")[1] == [Skipped(str(path), "unreadable", why)]


def test_a_damaged_record_is_damaged_after_a_good_one_of_its_shape(tmp_path):
    """Whatever a reader keeps from one record to the next, a damaged record read after a good one of its shape (a
    sweep's 100,000 records share it) is still damaged, for the same reason."""
    good = json.loads(written(tmp_path / "good").read_text())
    assert damage(good) is None
    for index, (name, edit, why) in enumerate(CASES):
        path = written(tmp_path / str(index), edit)
        assert damage(json.loads(path.read_text())) == reason(path, why), name
        assert damage(json.loads(json.dumps(good))) is None


def test_a_field_left_out_and_a_field_set_to_null_are_told_apart_after_either_passed():
    """config.model_seed may be left out (a record from before it) but not null."""
    from peltbench.record import CONFIG_FIELDS, _field_damage

    config = {"method": {"name": "lora"}, "task": {"name": "rte"}, "train": {}, "dev_size": 500}
    assert _field_damage(config, CONFIG_FIELDS, "config.") is None
    assert _field_damage({**config, "model_seed": None}, CONFIG_FIELDS, "config.") == \
        "field 'config.model_seed' is null, expected an integer"
    assert _field_damage({**config, "model_seed": 3}, CONFIG_FIELDS, "config.") is None
