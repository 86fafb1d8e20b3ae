"""Mid-run checkpoints (issue 47): a run, or a fused group, stopped at any step and run again writes the records an
uninterrupted run writes: the same scores, history (its losses bitwise: the tests run with the thread count they
started with) and best epoch, with dropout on, for every method.

The stops: a stop signal (Ctrl-C, SIGTERM, SLURM's USR2) during a training step, during a dev pass (the checkpoint is
then written just after it), and kills that write nothing at the stop (kill -9, a node failure): during the test pass,
after a member's record, during a checkpoint write, where the run goes on from the last checkpoint written on the
timer. The command end to end (exit status, a real SIGTERM and kill -9): the tests at the end."""

from __future__ import annotations

import csv
import io
import json
import os
import re
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
from peltbench.missing import Sweep, interrupted_line, record_runs, report
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
    """Each run's record (`comparable`) and its metrics.csv (the default logger's; less each epoch's seconds)."""
    found = {}
    for path in sorted(results.rglob("result.json")):
        metrics = path.with_name("metrics.csv")
        rows = list(csv.DictReader(metrics.open())) if metrics.exists() else None
        found[str(path.parent.relative_to(results))] = {
            **comparable(json.loads(path.read_text())),
            "metrics.csv": [{key: value for key, value in row.items() if key != "epoch_seconds"} for row in rows or []]}
    return found


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
    if method == "lora":  # what peltbench-missing and the command's last line say of it
        [run] = record_runs([config("stopped")])
        assert (run.state, run.error) == ("missing", "resumable, epoch 1 of 2 (+2 steps)")
        assert report(Sweep([run], []))[1] == f"  missing  {run.label}: resumable, epoch 1 of 2 (+2 steps)"
        assert interrupted_line([config("stopped")], sweep=False) == (
            "interrupted: the run did not finish; its checkpoint is written, at epoch 1 of 2 (+2 steps): rerun the "
            "same command to go on from it")
        assert interrupted_line([config("stopped"), config("whole")]) == (
            "interrupted: 1 of 2 runs done, 1 not done; rerun the same command to run them (done runs are skipped; 1 "
            "of them go on from a checkpoint)")
    trained = run_again(monkeypatch)
    [resumed] = run_group([config("stopped")])
    assert trained == list(range(STOP_AT.get(method, 5) + 1, 8))  # on from the step after the stop, to the 8th
    assert resumed.status == reference.status == "ok" and not resumed.skipped
    assert records(tmp_path / "stopped") == records(tmp_path / "whole")  # metrics.csv too
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
                                                         monkeypatch, caplog):
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
    with caplog.at_level("INFO", logger="peltbench"):
        outcomes = run_group(configs)
    # on from the last checkpoint: the end of epoch 2's steps (before its dev pass), or epoch 1's after its dev pass
    assert trained[0] == (4 if where == "checkpoint write" else 8)
    [resume] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("resume: ")]
    if where == "after a record":  # the 2 members of 1 epoch had stopped at the checkpoint; 1 of 2 epochs done since
        assert resume == ("resume: a fused group of 4 runs (1 of this job's) from its checkpoint at epoch 1 of 3 (+4 "
                          "steps); 1 of them (done since, or not this job's) train along again, writing nothing; 2 "
                          "had stopped training before it and stay stopped")
    assert records(tmp_path) == whole_small_group
    assert not list(tmp_path.rglob(f"{checkpoints.TEMPORARY}*")) and folders_with_checkpoints(tmp_path) == []
    assert sum(not outcome.skipped for outcome in outcomes) >= 1


def test_a_halving_group_of_prompt_runs_stopped_after_a_rung_resumes_to_its_records(tmp_path, monkeypatch):
    """Successive halving (η = 2: rungs after epochs 1 and 2) in a group of prompt-tuning runs (prompts fuse with their
    own length only): stopped in epoch 2, after rung 1 pruned half of them; the ledger's decisions and the pruned
    runs' records stay, and the rest go on to the records of the group never stopped."""
    from conftest import save_tiny_encoder, write_glue

    model, glue = save_tiny_encoder("bert", tmp_path / "model", dropout=0.1), write_glue(tmp_path / "glue")

    def grid(results: Path) -> list:
        return [compose_config("method=prompt", f"method.lr={lr}", "task=rte", f"model.name={model}",
                               f"data.dir={glue}", f"results_dir={results}", "k=16", "dev_size=20",
                               "train.batch_size=4", "train.epochs=3", "train.patience=null", "fuse=true", "halving=2",
                               f"seed={seed}")
                for lr in ("1e-3", "3e-2") for seed in (111, 222)]

    whole = run_group(grid(tmp_path / "whole"))
    assert sorted(outcome.status for outcome in whole) == ["ok", "ok", "pruned", "pruned"]
    signal_at_step(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        run_group(grid(tmp_path / "stopped"))
    assert [record["status"] for record in records(tmp_path / "stopped").values()] == ["pruned", "pruned"]
    trained = run_again(monkeypatch)
    run_group(grid(tmp_path / "stopped"))
    assert trained[0] == 6 and records(tmp_path / "stopped") == records(tmp_path / "whole")
    ledger = lambda results: json.loads(next((results / ".halving").glob("*.json")).read_text())["rungs"]
    assert ledger(tmp_path / "stopped") == ledger(tmp_path / "whole")


def flip_exponent_bits(path: Path, tensor: torch.Tensor, values: int = 8) -> None:
    """In the file, flip one exponent bit (2^1: a value times 4 or a quarter) of `values` values of `tensor` (float32),
    found by its bytes: the file's structure stays intact."""
    data = bytearray(path.read_bytes())
    at = data.find(tensor.numpy().tobytes())
    assert at > 0 and data.find(tensor.numpy().tobytes(), at + 1) < 0
    for value in range(values):
        data[at + 4 * value + 2] ^= 0x80  # little-endian: byte 2's top bit is the exponent's lowest
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("why", ["cut short", "a flipped bit", "another config", "another torch",
                                 "a state that does not fit"])
def test_a_checkpoint_that_no_longer_matches_its_run_is_refused_in_one_line_and_the_run_starts_over(
        why, tiny_checkpoint, glue_dir, tmp_path, monkeypatch, caplog):
    def config(where: str):
        return compose_config(*overrides(tiny_checkpoint, glue_dir, tmp_path / where, "lora"))

    run_group([config("whole")])
    signal_at_step(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        run_group([config("stopped")])
    [folder] = folders_with_checkpoints(tmp_path / "stopped")
    path = folder / checkpoints.NAME
    if why == "cut short":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        expected = (rf"^{path} is damaged \(cut short, or its zip directory is: File is not a zip file\): "
                    rf"lora\S* starts over$")
    elif why == "a flipped bit":  # as a bad disk or copy would: torch loads it without a word
        moment = torch.load(path, weights_only=True)["loop"]["optimizer"]["banks"][0]["exp_avg"]
        flip_exponent_bits(path, moment)
        assert not torch.equal(torch.load(path, weights_only=True)["loop"]["optimizer"]["banks"][0]["exp_avg"], moment)
        expected = (rf"^{path} is damaged \(its record data/\d+ is not what was written: its CRC-32 differs\): lora\S* "
                    rf"starts over$")
    elif why == "another config":
        payload = torch.load(path, weights_only=True)
        payload["members"][0]["config_hash"] = "0" * 12
        torch.save(payload, path)
        expected = rf"^{path} is of another config \(config hash 000000000000, this run's \w+\): lora\S* starts over$"
    elif why == "another torch":
        payload = torch.load(path, weights_only=True)
        payload["training"]["torch"] = "2.4.1"
        torch.save(payload, path)
        expected = (rf"^{path} was written by peltbench \S+ with torch 2\.4\.1, and this is torch "
                    rf"{re.escape(str(torch.__version__))}, which may train otherwise: lora\S* starts over$")
    else:  # what no version writes: a state that its group cannot take (a bug), found before any step
        real = peltbench.train.Training.restore

        def restore(self, state):
            real(self, state)
            raise ValueError("the checkpoint's optimiser exp_avg has shape (3,), this group's (4,)")
        monkeypatch.setattr(peltbench.train.Training, "restore", restore)
        expected = (rf"^{path} cannot resume its group \(its state does not fit this group \(the checkpoint's optimiser "
                    rf"exp_avg has shape \(3,\), this group's \(4,\)\)\): its runs start over$")
    trained = run_again(monkeypatch)
    caplog.clear()
    with caplog.at_level("WARNING", logger="peltbench"):
        [outcome] = run_group([config("stopped")])
    [line] = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert re.match(expected, line), line
    assert trained == list(range(8)) and outcome.status == "ok"  # from the start
    assert records(tmp_path / "stopped") == records(tmp_path / "whole")


PROGRESS = {"steps": 5, "members": [{"unit": "epoch", "done": 1, "of": 2, "steps_into_next": 1, "training": True}]}


def written_checkpoint(folder: Path) -> Path:
    """A checkpoint as a run of one writes it (its loop's state: a few tensors and plain values)."""
    checkpoint = checkpoints.Checkpointer([{"label": "run", "config_hash": "abc", "config": {}}], [folder], None,
                                          lambda: [{"started_at": "then"}])
    generator = torch.Generator().manual_seed(0)
    checkpoint.save(lambda: {"optimizer": {"exp_avg": torch.randn(64, generator=generator)}, "evaluation": 1},
                    PROGRESS)
    return folder / checkpoints.NAME


def refusal(folder: Path) -> str:
    with pytest.raises(checkpoints.Refused) as refused:
        checkpoints.read(folder)
    return str(refused.value)


def test_a_file_that_is_no_peltbench_checkpoint_is_said_to_be_none(tmp_path):
    path = written_checkpoint(tmp_path)
    path.write_bytes(b"\x00" * 4096)  # zeros where a crash left them, or garbage
    assert refusal(tmp_path) == ("is not a peltbench checkpoint (not the zip archive torch.save writes): damaged, or "
                                 "another file")
    torch.save(torch.nn.Linear(2, 2), path)  # a whole model pickled
    assert refusal(tmp_path) == ("is not a peltbench checkpoint (a torch file holding objects, not tensors and plain "
                                 "values)")
    torch.save({"model": torch.zeros(3), "members": [], "loop": {}}, path)  # another program's torch file
    assert refusal(tmp_path) == "is not a peltbench checkpoint (a file torch.save wrote, without peltbench's header)"
    assert checkpoints.progress_of(tmp_path, "run") == ("its checkpoint is not a peltbench checkpoint (a file "
                                                        "torch.save wrote, without peltbench's header): it starts over")


def test_a_checkpoint_of_an_earlier_peltbench_is_refused_naming_its_format(tmp_path):
    """The previous version's header (format 1: one digest of the code and versions, no CRC-32 check promised): its
    training code is not this one's (checkpoint.py, component.py changed), so its run starts over, saying so."""
    path = written_checkpoint(tmp_path)
    payload = torch.load(path, weights_only=True)
    payload.update(format=1, training="3f2a9c0d1e5b7a66", peltbench="0.9.0")
    torch.save(payload, path)
    assert refusal(tmp_path) == "was written by peltbench 0.9.0 in checkpoint format 1; this peltbench reads format 2"


def test_a_checkpoint_of_other_training_code_names_the_files_and_versions_that_differ(tmp_path, monkeypatch):
    written_checkpoint(tmp_path)
    now = checkpoints.training_code()
    assert {"component.py", "train.py", "checkpoint.py", "methods/lora.py"} <= set(now["code"])
    assert checkpoints.read(tmp_path)["training"] == now

    def this_one(**changed):
        code = {**now["code"], **changed.pop("code", {})}
        monkeypatch.setattr(checkpoints, "training_code", lambda: {**now, **changed, "code": code})
    this_one(code={"component.py": "0" * 16})
    assert refusal(tmp_path).endswith("whose training code differs from this one's in component.py, which may train "
                                      "otherwise")
    this_one(code={"train.py": "1", "methods/lora.py": "2", "methods/new.py": "3", "data.py": "4"})
    assert refusal(tmp_path).endswith("differs from this one's in data.py, methods/lora.py, methods/new.py and 1 more, "
                                      "which may train otherwise")
    this_one(transformers="5.99.0", code={"train.py": "1"})  # a library's version is said first
    assert refusal(tmp_path) == (f"was written by peltbench {checkpoints.__version__} with transformers "
                                 f"{now['transformers']}, and this is transformers 5.99.0, which may train otherwise")


def test_crc32s_are_written_whatever_torchs_setting_and_a_flipped_bit_is_found(tmp_path, monkeypatch):
    torch.serialization.set_crc32_options(False)  # a user's setting: torch.save then writes none
    try:
        path = written_checkpoint(tmp_path)
        assert torch.serialization.get_crc32_options() is False  # left as the user set it
    finally:
        torch.serialization.set_crc32_options(True)
    payload = checkpoints.read(tmp_path)
    flip_exponent_bits(path, payload["loop"]["optimizer"]["exp_avg"].clone())
    assert re.fullmatch(r"is damaged \(its record data/\d+ is not what was written: its CRC-32 differs\)",
                        refusal(tmp_path))
    # peltbench-missing reads the header only (it may list many): the tensors are checked when the run resumes
    assert checkpoints.progress_of(tmp_path, "run") == "resumable, epoch 1 of 2 (+1 step)"


def test_checkpoints_come_every_checkpoint_every_minutes_and_not_at_all_with_null(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(checkpoints.time, "monotonic", lambda: clock[0])
    every = checkpoints.Checkpointer([], [], 10, lambda: [])
    never = checkpoints.Checkpointer([], [], None, lambda: [])
    clock[0] += 599
    assert not every.due() and not never.due()
    clock[0] += 1
    assert every.due() and not never.due()
    every.save(lambda: {}, {"steps": 1, "members": []})  # no run folder to write (every run has left): a no-op
    assert not every.due()


def test_the_optimisers_state_is_read_whole_whatever_it_holds():
    """MemberAdamW.state() keeps every tensor, array and plain value it and its banks hold but the parameters and
    views (so state added to the optimiser later is kept without naming it), and restore() puts it back in place."""
    from peltbench.methods import build_pelt_model
    from peltbench.packaged import packaged_config
    from peltbench.train import MemberAdamW
    from conftest import tiny_backbone

    import numpy as np

    model = build_pelt_model(tiny_backbone(), packaged_config("method/lora.yaml"), 42)
    optimizer = MemberAdamW(model)
    bank = optimizer.banks[0]
    bank.step_counts = np.arange(3)  # state a later version might add, under a name nothing here knows
    optimizer.per_member = {"steps": [1, 2]}
    bank.exp_avg.normal_()
    state = optimizer.state()
    assert set(state["banks"][0]) >= {"exp_avg", "exp_avg_sq", "step_counts"}
    assert "spans" not in state["banks"][0] and "params" not in state["banks"][0]  # gradients between steps, parameters
    assert state["optimizer"]["per_member"] == {"steps": [1, 2]}
    saved = torch.save(state, buffer := io.BytesIO()) or torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    again = MemberAdamW(model)
    again.banks[0].step_counts = np.zeros(3, dtype=np.int64)
    again.restore(saved)
    assert torch.equal(again.banks[0].exp_avg, bank.exp_avg) and again.banks[0].step_counts.tolist() == [0, 1, 2]
    assert again.per_member == {"steps": [1, 2]}


def test_adalora_budget_state_round_trips():
    """AdaLoRA's importance (both EMAs) and masks, after steps inside its budgeting phase, put back into a fresh
    model: the same scores, and the same masks after the next steps."""
    from peltbench.methods import build_pelt_model, component_state, plan_training, restore_components
    from peltbench.packaged import packaged_config
    from conftest import tiny_backbone

    def built():
        model = build_pelt_model(tiny_backbone(), packaged_config("method/adalora.yaml"), 42)
        plan_training(model, [40])
        return model

    def steps(model, first, count):
        generator = torch.Generator().manual_seed(first)
        for step in range(first, first + count):
            for parameter in model.adalora.parameters():
                parameter.grad = torch.randn(parameter.shape, generator=generator)
            model.adalora.after_step(step, [0])

    model = built()
    steps(model, 0, 10)  # t_i = 6: importance from step 0, masks from step 7
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True) if torch.save(
        component_state(model), buffer := io.BytesIO()) is None else None
    copy = built()
    with torch.no_grad():
        for theirs, mine in zip(model.adalora.parameters(), copy.adalora.parameters()):
            mine.copy_(theirs)
    restore_components(copy, saved)
    assert torch.equal(copy.adalora.scores(), model.adalora.scores())
    steps(model, 10, 3)
    steps(copy, 10, 3)
    assert torch.equal(copy.adalora.kept, model.adalora.kept) and copy.adalora.kept.sum() < model.adalora.kept.numel()


def test_the_command_killed_with_kill_9_goes_on_from_its_last_checkpoint(tiny_checkpoint, glue_dir, tmp_path,
                                                                        in_process):
    """End to end: `peltbench` with a checkpoint every 0.1 s, killed with SIGKILL mid-run (nothing runs at the kill:
    no checkpoint, no cleanup), then the same command: it goes on from the last checkpoint to the record of the run
    never stopped (run here, in this process)."""
    arguments = [*overrides(tiny_checkpoint, glue_dir, Path("results"), "lora", "train.epochs=40"), "train.patience=40",
                 "train.checkpoint_every=0.002"]
    whole = in_process(*[arg.replace("results_dir=results", "results_dir=whole") for arg in arguments], cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "stdout.txt", "w") as out:
        process = subprocess.Popen([str(Path(sys.executable).with_name("peltbench")), *arguments], cwd=tmp_path,
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while process.poll() is None and time.monotonic() < deadline and \
                not re.search(r"checkpoint: epoch \d+ of 40", (tmp_path / "stdout.txt").read_text()):
            time.sleep(0.01)  # the first checkpoint's epoch depends on the machine's speed: a fast one skips epoch 3
        assert process.poll() is None, (tmp_path / "stdout.txt").read_text()
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert not list((tmp_path / "results").rglob("result.json")) and folders_with_checkpoints(tmp_path / "results")
    again = in_process(*arguments, cwd=tmp_path)
    assert again.returncode == 0 and "from its checkpoint at epoch " in again.stdout + again.stderr
    assert records(tmp_path / "results") == records(tmp_path / "whole")
