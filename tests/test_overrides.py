"""A plain setting of a swept group in a sweep (`-m method=adapter,lora method.lr=1e-3`): issue 21 item 3a."""

from __future__ import annotations

import sys

import pytest
from conftest import SHIPPED_GLUE

from peltbench.overrides import as_given, pin_group_settings


def test_a_plain_group_setting_in_a_sweep_becomes_a_sweep_of_one_value():
    assert pin_group_settings(["-m", "method=adapter,lora", "method.lr=1e-3", "task=rte"]) == [
        "-m", "method=adapter,lora", "method.lr=choice(1e-3)", "task=rte"]
    assert pin_group_settings(["--multirun", "method.lora_targets=[query,value]"]) == [
        "--multirun", "method.lora_targets=choice([query,value])"]


def test_the_summary_repeats_the_command_as_given():
    given = ["-m", "method=adapter,lora", "method.lr=1e-3", "method.lora_targets=[query,value]", "task=rte"]
    assert as_given(pin_group_settings(given)) == given
    assert as_given(["method.lr=choice(1e-3,3e-4)"]) == ["method.lr=choice(1e-3,3e-4)"]  # a real sweep stays


@pytest.mark.parametrize("arguments", [
    ["method=adapter", "method.lr=1e-3", "task=rte"],                # not a sweep: Hydra composes it as is
    ["-m", "method=lora", "method.lr=1e-3", "task=rte,mrpc"],        # the group is fixed: its settings apply
    ["-m", "method=adapter,lora", "method.lr=1e-3,3e-4"],           # already a sweep
    ["-m", "method=adapter,lora", "+method.extra=1", "~method.lr", "k=100", "method.lr="],  # add, delete, not a group, empty
])
def test_other_arguments_are_left_as_given(arguments):
    assert pin_group_settings(arguments) == arguments


def _jobs(monkeypatch, tmp_path, *arguments):
    """The configs the sweep hands the runner, from `peltbench ARGUMENTS` run in this process."""
    import peltbench.runner
    from peltbench.cli import main
    from peltbench.runner import Outcome

    seen = []

    def run_group(cfgs, results_dir=None):
        seen.extend(cfgs)
        return [Outcome("ok", {"status": "ok"}) for _ in cfgs]

    monkeypatch.setattr(peltbench.runner, "run_group", run_group)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["peltbench", *arguments, f"data.dir={SHIPPED_GLUE}"])  # read before the runs
    try:
        main()
    except SystemExit as exit:
        assert exit.code in (0, 1, None)  # 1: the stand-in runner writes no records
    return [(cfg.method.name, cfg.method.lr, cfg.task.name) for cfg in seen]


def test_the_plain_form_runs_every_job_with_its_learning_rate(monkeypatch, tmp_path):
    jobs = _jobs(monkeypatch, tmp_path, "-m", "method=adapter,lora", "method.lr=1e-3", "task=rte")
    assert jobs == [("adapter", 0.001, "rte"), ("lora", 0.001, "rte")]


@pytest.mark.parametrize("lr, labels", [("1e-3", ["lr=0.001"]), ("1e-3,3e-4", ["lr=0.001", "lr=0.0003"])])
def test_both_spellings_compose_every_job(capsys, lr, labels):
    """peltbench-missing composes each job as the sweep does: the plain form and a value list alike."""
    from peltbench.missing import main

    assert main(["method=adapter,lora", f"method.lr={lr}", "task=rte", "results_dir=/nonexistent/results"]) == 1
    out = capsys.readouterr().out
    assert f"{2 * len(labels)} runs: 0 done" in out
    for method in ("adapter", "lora"):
        for label in labels:
            assert f"missing  {method},{label}/rte/k100/seed111" in out
