"""The objective axis (peltbench/objectives.py, conf/objective/, docs/protocol.md §12): checked before torch, part of a
run's identity and folder where it departs from what peltbench computed before, fused groups per objective, tables
never pooling another objective with the classifier's runs."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from conftest import a_record, compose_config
from peltbench import UserError, objectives
from peltbench.component import POSITIVE_INT, Setting
from peltbench.config import check_config
from peltbench.fusion import group_key
from peltbench.record import against_run, config_hash, examine, record_folder, semantic_config
from peltbench.tables.comparability import protocol_label, run_protocol


@pytest.fixture
def probe(monkeypatch):
    """A second objective, `probe` (one setting `depth`, its file's default 2), as a new objective's file and
    declaration would add it."""
    declaration = objectives.Objective(settings={"depth": Setting(POSITIVE_INT, "how deep")}, label="Probe")
    monkeypatch.setitem(objectives.OBJECTIVES, "probe", declaration)
    monkeypatch.setattr(objectives, "_packaged", lambda: frozenset({"classifier", "probe"}))
    real = objectives.file_defaults
    monkeypatch.setattr(objectives, "file_defaults",
                        lambda name: {"name": "probe", "depth": 2} if name == "probe" else real(name))
    return declaration


def plain(*overrides: str, objective: dict | None = None, drop: bool = False) -> dict:
    """The composed config as plain data (what a record holds), its objective node replaced or dropped."""
    cfg = OmegaConf.to_container(compose_config("method=adapter", "task=rte", *overrides), resolve=True)
    cfg.pop("hydra", None)
    if drop:
        del cfg["objective"]
    elif objective is not None:
        cfg["objective"] = objective
    return cfg


def test_the_default_objective_adds_nothing_to_a_runs_identity_or_folder():
    """A record made before objectives existed (its config has no `objective` node) is the classifier's run: the same
    identity, hash and folder as a run composed today."""
    cfg = compose_config("method=adapter", "task=rte")
    assert cfg.objective.name == "classifier"
    before = plain(drop=True)
    assert semantic_config(cfg) == semantic_config(before)
    assert "objective" not in semantic_config(cfg)
    assert config_hash(cfg) == "36f1b919c79800d9"  # test_record.py's literal from before objectives
    assert record_folder(cfg) == record_folder(before) == "adapter/rte/k100/seed111"
    lmbff = compose_config("method=adapter", "task=rte", "protocol=lmbff")
    assert record_folder(lmbff) == "adapter,protocol=lmbff/rte/k16/seed13"


def test_another_objective_is_another_run_with_its_own_folder(probe):
    at_default = plain(objective={"name": "probe", "depth": 2})
    deeper = plain(objective={"name": "probe", "depth": 3})
    assert semantic_config(at_default)["objective"] == {"name": "probe", "depth": 2}
    assert config_hash(OmegaConf.create(at_default)) != config_hash(compose_config("method=adapter", "task=rte"))
    assert record_folder(at_default) == "adapter,objective=probe/rte/k100/seed111"
    assert record_folder(deeper) == "adapter,objective=probe,objective.depth=3/rte/k100/seed111"
    named = plain("protocol=lmbff", objective={"name": "probe", "depth": 2})
    assert record_folder(named) == "adapter,objective=probe,protocol=lmbff/rte/k16/seed13"  # the protocol stays last


def test_a_record_of_another_objective_is_not_the_classifiers_run(probe):
    """Its folder differs; and where a record of one sits in the other's folder (moved by hand), a rerun stops at it
    naming the objective, the classifier's absent node read as the classifier."""
    cfg = compose_config("method=adapter", "task=rte")
    old = a_record()
    old["config"].pop("objective")
    old.pop("identity")  # a record from before objectives: its config and hash decide
    assert examine(old) == (None, [])
    assert against_run(old, cfg) == (None, [])
    other = a_record()
    other["config"]["objective"] = {"name": "probe", "depth": 2}
    other["identity"] = semantic_config(other["config"])
    other["config_hash"] = config_hash(OmegaConf.create(other["config"]))
    assert examine(other) == (None, [])
    damaged, differences = against_run(other, cfg)
    assert damaged is None
    assert differences == ["objective.depth (record 2, this run None)",
                           "objective.name (record 'probe', this run 'classifier')"]


def test_fused_groups_form_per_objective(probe):
    fused = compose_config("method=lora", "task=rte", "fuse=true")
    other = OmegaConf.create(copy.deepcopy(OmegaConf.to_container(fused)))
    other.objective = {"name": "probe", "depth": 2}
    assert group_key(fused) is not None and group_key(other) is not None
    assert group_key(fused) != group_key(other)
    assert group_key(fused)[:-1] == group_key(other)[:-1]  # the objective alone keeps them apart


def test_the_tables_never_pool_another_objective_with_the_classifier(probe):
    classifier = protocol_label(run_protocol(plain(), "fp32"))
    old = protocol_label(run_protocol(plain(drop=True), "fp32"))
    other = protocol_label(run_protocol(plain(objective={"name": "probe", "depth": 3}), "fp32"))
    assert classifier == old == "precision=fp32"
    assert other == "objective=probe,objective.depth=3,precision=fp32"
    named = protocol_label(run_protocol(plain("protocol=lmbff", objective={"name": "probe", "depth": 2}), "fp32"))
    assert named == "protocol=lmbff,objective=probe,precision=fp32"


@pytest.mark.parametrize("override, message", [
    ("+objective.depth=3", "objective.depth: not a setting of objective classifier; it has name"),
    ("objective.name=nope", "objective=nope: no such objective; choose from classifier, cloze"),
])
def test_a_bad_objective_is_refused_in_one_line(override, message):
    with pytest.raises(UserError) as error:
        check_config(compose_config("method=adapter", "task=rte", override))
    assert str(error.value) == message


def test_an_objectives_settings_are_checked_as_it_declares_them(probe):
    for node, message in (({"name": "probe", "depth": 0}, "objective.depth=0: must be a positive integer"),
                          ({"name": "probe"}, "objective.depth: missing; objective probe needs it (its file: "
                                              "conf/objective/probe.yaml)")):
        with pytest.raises(UserError) as error:
            check_config(OmegaConf.create(plain(objective=node)))
        assert str(error.value) == message


def test_the_command_refuses_an_unknown_objective_before_anything_runs(in_process, tmp_path):
    result = in_process("method=lora", "task=rte", "objective=nope", cwd=tmp_path)
    assert result.returncode == 2
    assert "objective/nope" in result.stderr and "classifier" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
