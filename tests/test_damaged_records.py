"""One rule for a record that contradicts itself (issue 40, item 4): a record whose stored `identity` does not hash to
its `config_hash` is damaged, and the rerun, peltbench-missing and the tables each say so in one line; none takes it
as done."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import SHIPPED_GLUE, compose_config

from peltbench.missing import main as missing
from peltbench.record import config_hash, format_record, identity_hash, record_path
from peltbench.runner import _identity
from peltbench.tables.records import read_records

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
    """What the issue found: the identity's LoRA rank and max length changed, config and config_hash left alone."""
    record["identity"]["method"]["lora_rank"] = 16
    record["identity"]["train.max_length"] = 256


def test_a_record_as_written_is_not_damaged(tmp_path, in_process, capsys):
    path = written(tmp_path / "results")
    record = json.loads(path.read_text())
    assert identity_hash(record["identity"]) == record["config_hash"]
    assert in_process(*RUN, "results_dir=results", cwd=tmp_path).returncode == 0  # done: skipped
    assert missing([*RUN, f"results_dir={tmp_path / 'results'}"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1 runs: 1 done, 0 failed, 0 missing"
    records, unreadable = read_records(tmp_path / "results")
    assert len(records) == 1 and unreadable == []


def test_a_record_whose_identity_does_not_hash_to_its_config_hash_is_damaged_everywhere(tmp_path, in_process, capsys):
    path = written(tmp_path / "results", hand_edited)
    text = path.read_text()
    record = json.loads(text)
    why = (f"its identity hashes to {identity_hash(record['identity'])}, not to its config_hash "
           f"{record['config_hash']} (edited after it was written?)")

    rerun = in_process(*RUN, "results_dir=results", cwd=tmp_path)  # the rerun stops at it, in one line
    assert rerun.returncode == 2
    assert rerun.stderr == f"peltbench: error: {path} holds a damaged record: {why}; move it away to rerun the run\n"
    assert path.read_text() == text

    assert missing([*RUN, f"results_dir={tmp_path / 'results'}"]) == 1  # not done, and not in the commands to run
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 runs: 0 done, 0 failed, 0 missing, 1 damaged"
    assert f"  damaged  {path}: {why}; move it away to rerun it" in out
    assert not any(line.strip().startswith("peltbench -m") for line in out)

    records, unreadable = read_records(tmp_path / "results")  # the tables leave it out, saying why
    assert records.empty
    assert unreadable == [(str(path), f"damaged: {why}; move it away and rerun it")]


def test_an_identity_that_is_not_an_object_is_damaged(tmp_path):
    from peltbench.record import damage

    path = written(tmp_path, lambda record: record.update(identity="lora"))
    assert damage(json.loads(path.read_text())) == 'its identity is "lora", not an object'
    assert read_records(tmp_path)[1][0][1].startswith("damaged: its identity is")


def test_records_from_before_identity_have_nothing_to_contradict(tmp_path):
    from peltbench.record import damage

    path = written(tmp_path, lambda record: record.pop("identity"))
    assert damage(json.loads(path.read_text())) is None
    assert len(read_records(tmp_path)[0]) == 1
