"""A record keeps the identity it was written with (issue 32, item 1): a record of the LM-BFF CoLA split from before the
chained shuffles (10b10cf) is another run than today's, and says so when a run, peltbench-missing or a table meets it;
a record written by today's code stays done. Both records were written by the code of their commit
(tests/data/lmbff_cola_split/generate.sh)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SHIPPED_GLUE, compose_config

from peltbench.record import changed_meaning, config_differences, config_hash, identity_hash, record_path, semantic_config, stored_identity

FIXTURES = Path(__file__).parent / "data" / "lmbff_cola_split"
MODEL = "/tmp/peltbench-fixture/tiny-bert"  # what the records name; never loaded here
RUN = ["protocol=lmbff", "method=lora", "task=cola", "seed=13", f"model.name={MODEL}", "train.max_steps=2",
       "train.eval_every=1"]
OLD = "split (record None, this run 'lmbff-chained')"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def placed(name: str, results: Path) -> Path:
    """The fixture `name` where today's run of RUN looks for its record, under `results`."""
    path = record_path(compose_config(*RUN, f"results_dir={results}"), results)
    path.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / f"{name}.json", path)
    return path


def test_the_fixtures_are_what_their_commits_wrote():
    before, chained = fixture("before_chained"), fixture("chained")
    assert before["versions"]["git_commit"].startswith("e7cf31c") and chained["versions"]["git_commit"].startswith("50c7a30")
    assert "identity" not in before and "identity" not in chained  # both from before records stored their identity
    assert not set(before["split"]["train_indices"]) & set(chained["split"]["train_indices"])  # another split


def test_a_rerun_over_a_record_of_the_old_split_stops_with_the_line_the_docs_promise(tmp_path, in_process):
    path = placed("before_chained", tmp_path / "results")
    text = path.read_text()
    result = in_process(*RUN, f"data.dir={SHIPPED_GLUE}", "results_dir=results", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"peltbench: error: {path} holds a record of a different config ({OLD}); move it away or choose "
                   f"another results_dir\n")
    assert path.read_text() == text and sorted(p.name for p in path.parent.iterdir()) == ["result.json"]


def test_peltbench_missing_does_not_count_a_record_of_the_old_split_done(tmp_path, capsys):
    from peltbench.missing import main

    placed("before_chained", tmp_path)
    assert main([*RUN, f"results_dir={tmp_path}"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 runs: 0 done, 0 failed, 0 missing, 1 held by another config's record"
    assert any(line.endswith(f"/seed13/result.json holds another config's record ({OLD}): move it away or set "
                             f"results_dir") for line in out), out


def test_a_record_written_by_main_before_issue_32_is_still_done(tmp_path, in_process, capsys):
    """Its hash, folder and meaning stay: the rerun skips it, peltbench-missing counts it done."""
    from peltbench.missing import main as missing

    record = fixture("chained")
    cfg = compose_config(*RUN)
    assert config_hash(cfg) == record["config_hash"] and record_path(cfg, Path("r")).parts[1] == record["variant"]
    path = placed("chained", tmp_path / "results")
    assert in_process(*RUN, f"data.dir={SHIPPED_GLUE}", "results_dir=results", cwd=tmp_path).returncode == 0
    assert missing([*RUN, f"results_dir={tmp_path / 'results'}"]) == 0
    assert "1 runs: 1 done, 0 failed, 0 missing" in capsys.readouterr().out
    assert json.loads(path.read_text()) == record


def test_a_record_is_compared_with_the_identity_it_stored_not_one_derived_again():
    before, chained = fixture("before_chained"), fixture("chained")
    cfg = compose_config(*RUN)
    assert "split" not in stored_identity(before) and stored_identity(chained) == semantic_config(cfg)
    assert config_differences(before, cfg) == [OLD] and config_differences(chained, cfg) == []
    # what tables need: the old record is not today's run of its own config; today's record is
    assert changed_meaning(before) == [OLD] and changed_meaning(chained) == []


def test_a_new_record_stores_its_identity(tmp_path):
    """Every part of the identity is in the record as the run had it, the derived split marker included."""
    from peltbench.runner import _identity

    cfg = compose_config(*RUN)
    record = _identity(cfg, config_hash(cfg))
    assert record["identity"] == semantic_config(cfg) and record["identity"]["split"] == "lmbff-chained"
    # a record that says it was made without the marker is the old split's, whatever its config derives today
    before = {k: v for k, v in record["identity"].items() if k != "split"}
    made_before = {**record, "status": "failed", "identity": before, "config_hash": identity_hash(before)}
    assert config_differences(made_before, cfg) == [OLD] and changed_meaning(made_before) == [OLD]


@pytest.mark.parametrize("overrides", [["protocol=lmbff", "task=cola", "seed=100"], ["protocol=lmbff", "task=rte"],
                                       ["task=cola"], ["task=rte", "method.lora_rank=4"]])
def test_records_without_a_stored_identity_keep_their_meaning(overrides):
    """A record from before `identity` (its config and hash only) is the run its config says, where no derived part
    applies; where one does, its hash decides (above)."""
    cfg = compose_config("method=lora", *overrides)
    from peltbench.record import model_identity
    from omegaconf import OmegaConf

    record = {"config": OmegaConf.to_container(cfg, resolve=True), "config_hash": config_hash(cfg),
              "model": model_identity(cfg.model.name)}
    assert stored_identity(record) == semantic_config(cfg) and changed_meaning(record) == []
    assert config_differences(record, cfg) == []


def test_the_tables_leave_a_record_of_the_old_split_out_and_say_why(tmp_path):
    """Not the LM-BFF CoLA cell: listed among the records the tables cannot use, with its reason; today's record is read."""
    from peltbench.tables.records import read_records

    placed("before_chained", tmp_path / "old")
    placed("chained", tmp_path / "new")
    old, unusable = read_records(tmp_path / "old")
    assert len(old) == 0 and len(unusable) == 1
    assert unusable[0][1:] == ("changed", f"made when its config meant another run ({OLD}): rerun it (move this record "
                                            "away first)")
    new, unusable = read_records(tmp_path / "new")
    assert len(new) == 1 and unusable == []
