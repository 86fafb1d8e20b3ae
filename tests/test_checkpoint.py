"""Mid-run checkpoints (issue 47): a run, or a fused group, stopped at any step and run again writes the records an
uninterrupted run writes: the same scores, history (its losses bitwise: the tests run with the thread count they
started with) and best epoch, with dropout on, for every method.

The stops: a stop signal (Ctrl-C, SIGTERM, SLURM's USR2) during a training step, during a dev pass (the checkpoint is
then written just after it), and kills that write nothing at the stop (kill -9, a node failure): during the test pass,
after a member's record, during a checkpoint write, where the run goes on from the last checkpoint written on the
timer. The command end to end (exit status, a real SIGTERM and kill -9): the tests at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import peltbench.train
from conftest import REPO, compose_config, tiny_method_overrides, tiny_run_overrides
from peltbench import checkpoint as checkpoints
from peltbench import interrupts, runner
from peltbench.record import record_path
from peltbench.runner import run_group

METHODS = sorted(path.stem for path in (REPO / "conf" / "method").glob("*.yaml"))
# The step a stop signal comes at (4 steps per epoch): inside epoch 2; AdaLoRA's inside its budgeting phase (steps 2-3
# of 8: importance and masks both in play), which ends at step 4 and forgets the importance
STOP_AT = {"adalora": 2}
# What differs between two runs of one config however they went: timings, memory, when.
VOLATILE = ("train_seconds", "train_seconds_share", "eval_seconds", "eval_seconds_share", "test_seconds", "peak_memory",
            "finished_at", "started_at")


class Killed(BaseException):
    """A process killed where it stood (kill -9, a node failure): nothing after it runs but `finally` blocks, which
    write nothing a kill would not leave either (claims go stale, loggers' files stay)."""


@pytest.fixture(autouse=True)
def no_signal_left(monkeypatch):
    """Each test starts and ends with no stop signal received or waiting (module state of peltbench.interrupts)."""
    monkeypatch.setattr(interrupts, "_received", False)
    monkeypatch.setattr(interrupts, "_pending", None)
    monkeypatch.setattr(interrupts, "_signal", signal.SIGINT)


def overrides(tiny_checkpoint, glue_dir, results: Path, method: str, *more: str) -> list[str]:
    """A tiny run with 4 steps per epoch (k = 16, batch 4), so that a stop can fall inside an epoch."""
    return [f"method={method}", "task=rte", *tiny_run_overrides(tiny_checkpoint, glue_dir, results),
            "train.batch_size=4", "train.epochs=2", *tiny_method_overrides(method), *more]


def comparable(record: dict) -> dict:
    """A record less what differs between any two runs of its config (VOLATILE; results_dir: where it was written)."""
    kept = {key: value for key, value in record.items() if key not in VOLATILE}
    kept["config"] = {key: value for key, value in record["config"].items() if key != "results_dir"}
    return kept


def records(results: Path) -> dict[str, dict]:
    return {str(path.parent.relative_to(results)): comparable(json.loads(path.read_text()))
            for path in sorted(results.rglob("result.json"))}


def signal_at_step(monkeypatch, step: int, signum: int = signal.SIGINT) -> None:
    """The stop signal during optimiser step `step` (0-based, the group's), as the command's handler receives it."""
    real = peltbench.train.after_step

    def after_step(model, at):
        real(model, at)
        if at == step:
            interrupts._handler(signum, None)
    monkeypatch.setattr(peltbench.train, "after_step", after_step)


def run_again(monkeypatch) -> list[int]:
    """As the same command run again: a new process, no signal received, no stop hooked into training. Returns the
    steps it will train (each optimiser step's number, as they come): where it went on from."""
    monkeypatch.setattr(interrupts, "_received", False)
    monkeypatch.setattr(interrupts, "_pending", None)
    trained = []

    def after_step(model, step):
        trained.append(step)
        peltbench.methods.after_step(model, step)
    monkeypatch.setattr(peltbench.train, "after_step", after_step)
    return trained


def checkpoint_every_step(monkeypatch) -> list[int]:
    """A checkpoint at every step boundary (as the timer would at one every few seconds); the steps written at."""
    written = []
    real = checkpoints.Checkpointer.save

    def save(self, state, progress):
        written.append(progress["steps"])
        real(self, state, progress)
    monkeypatch.setattr(checkpoints.Checkpointer, "due", lambda self: True)
    monkeypatch.setattr(checkpoints.Checkpointer, "save", save)
    return written


def folders_with_checkpoints(results: Path) -> list[Path]:
    return sorted(path.parent for path in results.rglob(checkpoints.NAME))


@pytest.mark.parametrize("method", METHODS)
def test_every_method_stopped_inside_an_epoch_resumes_to_its_uninterrupted_record(method, tiny_checkpoint, glue_dir,
                                                                                    tmp_path, monkeypatch):
    def config(where: str):
        return compose_config(*overrides(tiny_checkpoint, glue_dir, tmp_path / where, method))

    [reference] = run_group([config("whole")])
    signal_at_step(monkeypatch, STOP_AT.get(method, 5))
    with pytest.raises(KeyboardInterrupt):
        run_group([config("stopped")])
    folder = record_path(config("stopped"), tmp_path / "stopped").parent
    assert folders_with_checkpoints(tmp_path / "stopped") == [folder] and not (folder / "result.json").exists()
    trained = run_again(monkeypatch)
    [resumed] = run_group([config("stopped")])
    assert trained == list(range(STOP_AT.get(method, 5) + 1, 8))  # on from the step after the stop, to the 8th
    assert resumed.status == reference.status == "ok" and not resumed.skipped
    assert comparable(resumed.record) == comparable(reference.record)
    assert not (folder / checkpoints.NAME).exists()  # gone with the record


# A fused group of every method that shares a frozen backbone (prompt tuning fuses only with its own length: its own
# group below), members leaving at epochs 1, 2 and 3 (their train.epochs), so that a stop in epoch 2 finds some done
FUSED = [method for method in METHODS if method not in ("ft", "prompt")]


def group_configs(tiny_checkpoint, glue_dir, results: Path, methods: list[str], *more: str) -> list:
    return [compose_config(*overrides(tiny_checkpoint, glue_dir, results, method, f"train.epochs={1 + i % 3}", *more))
            for i, method in enumerate(methods)]


@pytest.fixture(scope="module")
def whole_group(tiny_checkpoint, glue_dir, tmp_path_factory) -> dict[str, dict]:
    """The uninterrupted fused group's records, by run folder."""
    results = tmp_path_factory.mktemp("whole-group")
    outcomes = run_group(group_configs(tiny_checkpoint, glue_dir, results, FUSED))
    assert [outcome.status for outcome in outcomes] == ["ok"] * len(FUSED)
    assert outcomes[0].record["fused"]["size"] == len(FUSED)
    return records(results)


def test_a_fused_group_of_every_method_stopped_inside_an_epoch_resumes_to_its_records(whole_group, tiny_checkpoint,
                                                                                       glue_dir, tmp_path, monkeypatch):
    configs = group_configs(tiny_checkpoint, glue_dir, tmp_path, FUSED)
    signal_at_step(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        run_group(configs)
    done_first = set(records(tmp_path))  # the members of 1 epoch, done before the stop
    assert done_first and len(folders_with_checkpoints(tmp_path)) == len(FUSED) - len(done_first)
    trained = run_again(monkeypatch)
    outcomes = run_group(configs)
    assert trained[0] == 6 and sum(outcome.skipped for outcome in outcomes) == len(done_first)
    assert records(tmp_path) == whole_group
    assert folders_with_checkpoints(tmp_path) == []


SMALL = ["adalora", "unipelt_apl", "lora", "prefix"]  # epochs 1, 2, 3, 1: members leave at epochs 1, 2 and 3


@pytest.fixture(scope="module")
def whole_small_group(tiny_checkpoint, glue_dir, tmp_path_factory) -> dict[str, dict]:
    results = tmp_path_factory.mktemp("whole-small-group")
    run_group(group_configs(tiny_checkpoint, glue_dir, results, SMALL))
    return records(results)


def call_at(monkeypatch, module, name: str, when, then) -> None:
    """`then()` when `module.name(*args)` is called with arguments for which `when(*args)` holds (before it runs)."""
    real = getattr(module, name)

    def called(*args, **kwargs):
        if when(*args, **kwargs):
            then()
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, called)


def test_a_stop_during_a_dev_pass_writes_the_checkpoint_just_after_it(whole_small_group, tiny_checkpoint, glue_dir,
                                                                      tmp_path, monkeypatch):
    """The signal waits for the dev pass (and the test pass and records of the members that stop there) to end: the
    checkpoint is at the first step boundary after them, epoch 1 done."""
    dev_passes = []
    call_at(monkeypatch, peltbench.train, "evaluate", lambda *args, **kwargs: args[4] == "dev" and
            dev_passes.append(1) is None and len(dev_passes) == 1,
            lambda: interrupts._handler(signal.SIGTERM, None))
    written = checkpoint_every_step(monkeypatch)
    monkeypatch.setattr(checkpoints.Checkpointer, "due", lambda self: False)  # only the signal's
    configs = group_configs(tiny_checkpoint, glue_dir, tmp_path, SMALL)
    with pytest.raises(KeyboardInterrupt):
        run_group(configs)
    assert written == [4] and interrupts.exit_status() == 143  # after epoch 1's 4 steps and its dev pass
    assert len(records(tmp_path)) == 2  # the two members of 1 epoch finished first
    trained = run_again(monkeypatch)
    run_group(configs)
    assert trained[0] == 4 and records(tmp_path) == whole_small_group


@pytest.mark.parametrize("where", ["test pass", "after a record", "checkpoint write"])
def test_a_group_killed_resumes_from_its_last_checkpoint(where, whole_small_group, tiny_checkpoint, glue_dir, tmp_path,
                                                         monkeypatch):
    """Killed where no checkpoint can be written at the stop (kill -9, a node failure), with checkpoints on the timer
    (here at every step): in epoch 2's test pass, just after the first record of epoch 2 (its run is done when the
    group resumes, from a checkpoint that has it training: it trains along again, its record kept), or while a
    checkpoint is written (the one before it resumes; what the write left is removed)."""
    written = checkpoint_every_step(monkeypatch)
    configs = group_configs(tiny_checkpoint, glue_dir, tmp_path, SMALL)

    def kill():
        raise Killed
    if where == "test pass":
        tests = []
        call_at(monkeypatch, peltbench.train, "evaluate", lambda *args, **kwargs: args[4] == "test" and
                tests.append(1) is None and len(tests) == 2, kill)
    elif where == "after a record":
        count = []
        call_at(monkeypatch, runner, "_recorded", lambda run: count.append(1) is None and len(count) == 3,
                kill)
    else:
        saves = []

        def half_written(payload, out):
            saves.append(1)
            if len(saves) == 7:
                out.write(b"PK\x03\x04 half a checkpoint")
                out.flush()
                written_to = Path(os.readlink(f"/proc/self/fd/{out.fileno()}"))
                os.link(written_to, written_to.with_name(f"{checkpoints.TEMPORARY}left.tmp"))  # what kill -9 leaves
                raise Killed
            real_save(payload, out)
        real_save = torch.save
        monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(Killed):
        run_group(configs)
    if where == "checkpoint write":
        assert list(tmp_path.rglob(f"{checkpoints.TEMPORARY}*")) and written[-1] == 5
    monkeypatch.undo()
    trained = run_again(monkeypatch)
    outcomes = run_group(configs)
    # on from the last checkpoint: the end of epoch 2's steps (before its dev pass), or epoch 1's after its dev pass
    assert trained[0] == (4 if where == "checkpoint write" else 8)
    assert records(tmp_path) == whole_small_group
    assert not list(tmp_path.rglob(f"{checkpoints.TEMPORARY}*")) and folders_with_checkpoints(tmp_path) == []
    assert sum(not outcome.skipped for outcome in outcomes) >= 1
