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
from peltbench import interrupts
from peltbench.record import record_path
from peltbench.runner import run_group

METHODS = sorted(path.stem for path in (REPO / "conf" / "method").glob("*.yaml"))
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
            "train.batch_size=4", "train.patience=2", *tiny_method_overrides(method), *more]


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
    signal_at_step(monkeypatch, 5)  # epoch 2, its second step
    with pytest.raises(KeyboardInterrupt):
        run_group([config("stopped")])
    folder = record_path(config("stopped"), tmp_path / "stopped").parent
    assert folders_with_checkpoints(tmp_path / "stopped") == [folder] and not (folder / "result.json").exists()
    monkeypatch.setattr(peltbench.train, "after_step", peltbench.methods.after_step)
    [resumed] = run_group([config("stopped")])
    assert resumed.status == reference.status == "ok" and not resumed.skipped
    assert comparable(resumed.record) == comparable(reference.record)
    assert not (folder / checkpoints.NAME).exists()  # gone with the record
