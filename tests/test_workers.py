"""A sweep on several devices (`hydra.launcher.devices`): peltbench.workers (which devices, a worker's environment,
which group first) and the local launcher's workers (hydra_plugins/peltbench_local/_pool.py, _worker.py): the same
records as one device, one screen, and what a dead worker or a stop signal leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peltbench import UserError
from peltbench.workers import check_run_device, hand_out_order, sweep_devices, worker_environment, worker_threads

PELTBENCH = str(Path(sys.executable).with_name("peltbench"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
TINY = ["model.name=tiny-bert", "data.dir=glue", "dev_size=20", "train.patience=50", "results_dir=results"]
TWO_CPUS = "hydra.launcher.devices=[cpu,cpu]"
# Fields that say when, where and how fast a run trained, not what it computed (as scripts/fixed_sweep.py leaves out)
VOLATILE = {"started_at", "finished_at", "versions", "machine", "peak_memory", "config", "identity", "traceback"}


# ---------------------------------------------------------------- which devices


def test_the_devices_of_a_sweep_are_each_entry_or_every_visible_gpu():
    four = lambda: 4  # noqa: E731
    assert sweep_devices(None) is None  # unset: the sweep trains in its own process, as before
    assert sweep_devices(["cpu", "cpu"]) == ["cpu", "cpu"]
    assert sweep_devices(["cuda:0", "cuda:3"], four) == ["cuda:0", "cuda:3"]
    assert sweep_devices("all", four) == sweep_devices("cuda:*", four) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


@pytest.mark.parametrize("spec,gpus,message", [
    ("all", 0, "hydra.launcher.devices=all: no CUDA GPU is visible here (CUDA_VISIBLE_DEVICES=unset); on a CPU give "
               "[cpu,cpu]"),
    ([], 4, "hydra.launcher.devices=[]: give a list of devices, e.g. [cuda:0,cuda:1] or [cpu,cpu], or `all` (every "
            "visible GPU)"),
    (["cuda", "cuda"], 4, "hydra.launcher.devices=[cuda,cuda]: cuda is not a device: give cpu or cuda:N for each "
                          "worker (or `all`, every visible GPU)"),
    (["gpu0"], 4, "hydra.launcher.devices=[gpu0]: gpu0 is not a device: give cpu or cuda:N for each worker (or "
                  "`all`, every visible GPU)"),
    (["cuda:0", "cpu"], 4, "hydra.launcher.devices=[cuda:0,cpu]: all CUDA or all CPU (a record names its device, "
                           "and which worker takes a group is not fixed)"),
    (["cuda:0", "cuda:4"], 4, "hydra.launcher.devices=[cuda:0,cuda:4]: cuda:4: this machine has 4 visible GPUs "
                              "(cuda:0-3)"),
    (["cuda:0"], 0, "hydra.launcher.devices=[cuda:0]: cuda:0: this machine has no visible GPU"),
])
def test_a_bad_device_list_is_refused_in_one_line(spec, gpus, message, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(UserError) as refused:
        sweep_devices(spec, lambda: gpus)
    assert str(refused.value) == message


def test_a_run_on_a_workers_device_leaves_its_device_to_the_worker():
    check_run_device("auto", ["cuda:0", "cuda:1"])
    check_run_device("cuda", ["cuda:0", "cuda:1"])
    check_run_device("cpu", ["cpu", "cpu"])
    with pytest.raises(UserError, match=r"^device=cuda:1 with hydra.launcher.devices=\[cuda:0,cuda:1\]: each worker "
                                        r"trains on its own device; leave device=auto \(or cuda\)$"):
        check_run_device("cuda:1", ["cuda:0", "cuda:1"])
    with pytest.raises(UserError, match=r"^device=cuda with hydra.launcher.devices=\[cpu,cpu\]"):
        check_run_device("cuda", ["cpu", "cpu"])


def test_a_worker_sees_its_gpu_alone_and_its_share_of_the_cores():
    # cuda:1 is the second GPU this process sees: GPU 5 under CUDA_VISIBLE_DEVICES=4,5
    assert worker_environment("cuda:1", ["cuda:0", "cuda:1"], {"CUDA_VISIBLE_DEVICES": "4,5",
                                                                "SLURM_CPUS_PER_TASK": "8"}) == \
        {"CUDA_VISIBLE_DEVICES": "5", "OMP_NUM_THREADS": "4"}
    assert worker_environment("cuda:1", ["cuda:0", "cuda:1"], {"OMP_NUM_THREADS": "3"}) == {"CUDA_VISIBLE_DEVICES": "1"}
    # a cpu worker sees no GPU: a run's device=auto is the CPU there
    assert worker_environment("cpu", ["cpu"] * 3, {"SLURM_CPUS_PER_TASK": "8"}) == \
        {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"}
    assert worker_threads(2, {}) == max(1, len(os.sched_getaffinity(0)) // 2)
    assert worker_threads(16, {"SLURM_CPUS_PER_TASK": "4"}) == 1


def test_the_longest_group_goes_first_and_one_of_unknown_length_before_it():
    assert hand_out_order([10.0, 30.0, None, 30.0, 20.0]) == [2, 1, 3, 4, 0]


# ---------------------------------------------------------------- a sweep on two CPU workers


def records(root: Path) -> dict[str, dict]:
    """Each record under `root`, by its folder, less what says when, where and how fast it trained."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in VOLATILE and not k.endswith("_seconds")
                    and not k.endswith("_seconds_share")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return {str(path.parent.relative_to(root)): strip(json.loads(path.read_text()))
            for path in sorted(root.rglob("result.json"))}


def test_a_sweep_on_two_cpu_workers_writes_the_records_of_one_device(workdir, in_process):
    # 4 groups: two fused pairs (k=16, k=24) and fine-tuning twice (alone): each worker trains two of them
    grid = ["-m", "method=adapter,lora,ft", "task=rte", "k=16,24", "seed=111", "train.epochs=3", "fuse=true", *TINY]
    one = in_process(*grid, "results_dir=one", "hydra.sweep.dir=sweeps/one", cwd=workdir)
    assert one.returncode == 0, one.stdout + one.stderr
    two = in_process(*grid, "results_dir=two", "hydra.sweep.dir=sweeps/two", TWO_CPUS, cwd=workdir)
    output = two.stdout + two.stderr
    assert two.returncode == 0, output
    expected = records(workdir / "one")
    assert len(expected) == 6 and records(workdir / "two") == expected
    assert sum(record["fused"] is not None for record in expected.values()) == 4
    # one screen: the plan, the workers, a line per group handed out and per group finished, one summary
    lines = [line.split("] ", 1)[1] for line in output.splitlines() if line.startswith("[")]
    assert lines[0] == "6 runs: 6 to train, 4 of them in 2 fused groups"
    assert lines[1] == "2 workers: cpu, cpu (their consoles: sweeps/two/.workers)"
    handed = [line.split(": ", 1)[1] for line in lines if line.startswith(("cpu-0: ", "cpu-1: "))]
    finished = [line for line in lines if " of 6 done" in line]
    # longest first: the fused pairs (k=24's, then k=16's), then fine-tuning, which trains alone (and says so)
    assert [line.split(":")[0] for line in handed] == ["runs #1, #3, fused", "runs #0, #2, fused", "run #5", "run #4"]
    assert lines.count("fine-tuning trains alone: it changes the backbone, which fused runs share") == 2
    assert len(finished) == 4
    assert [line.split(" · ")[0] for line in finished][-1].endswith(" of 6 done")
    assert all(line.split(" · ")[-1].startswith("now: cpu-0 ") for line in finished)
    assert finished[-1].endswith("now: cpu-0 idle, cpu-1 idle")
    assert "peltbench sweep: 6 runs: 6 done (0 of them skipped as already done), 0 failed, 0 missing" in output
    assert "epoch 1/3" not in output  # the training's own lines are in each group's job log, not on the screen
    logs = sorted((workdir / "sweeps" / "two").glob("[0-9]*/*.log"))  # the job folders (not .workers)
    assert sum(" - epoch 1" in log.read_text() for log in logs) == 4  # each group's log in its job folder, as before
    assert sorted(path.name for path in (workdir / "sweeps" / "two" / ".workers").iterdir()) == ["0_cpu.log", "1_cpu.log"]



def test_a_worker_whose_pipe_closes_before_its_process_ends_loses_its_group():
    """The moment after a kill -9: the worker's end of the pipe is closed but its process is not yet reaped (alive, to
    is_alive). The sweep's process must still wait for its end and return its group's runs lost: once the worker is
    gone it is never looked at again, and a run without a return ended the sweep in a KeyError's traceback."""
    import multiprocessing
    from collections import deque

    from hydra_plugins.peltbench_local._pool import DevicePool, Worker
    from hydra_plugins.peltbench_local._progress import SweepProgress

    context = multiprocessing.get_context("fork")  # a child that only sleeps: no torch, no spawn
    ours, theirs = context.Pipe()
    child = context.Process(target=time.sleep, args=(120,))
    child.start()
    theirs.close()

    class Exiting:
        """The child's process as the sweep sees it just after SIGKILL: alive to the first is_alive."""
        def __init__(self):
            self.asked = 0
            self.sentinel, self.kill = child.sentinel, child.kill

        def is_alive(self):
            self.asked += 1
            return self.asked == 1 or child.is_alive()

        def join(self, timeout=None):
            child.join(timeout)

        exitcode = property(lambda self: child.exitcode)

    pool = DevicePool.__new__(DevicePool)  # its state alone: no launcher (a run's job folder is then unknown)
    pool.launcher, pool.failed, pool.returns, pool.stopping, pool.order, pool.alone = None, {}, {}, 0, deque(), ()
    pool.packs, pool.progress = [[(["method=lora"], 7)]], SweepProgress(1, 1)
    worker = Worker("cpu-0", "cpu", Exiting(), ours, Path("0_cpu.log"), pack=0, started=time.monotonic())
    pool.workers = [worker]
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not worker.gone and time.monotonic() < deadline:
        pool._collect()
    assert worker.gone and pool.failed == {"cpu-0": "killed by SIGKILL"}
    assert pool.returns[7].return_value == "lost" and worker.pack is None


def _started(arguments: list[str], workdir: Path, name: str) -> subprocess.Popen:
    """`peltbench ARGUMENTS` in a session of its own (so that a Ctrl-C can reach all its processes, as a terminal's
    does), its output to NAME.txt."""
    with open(workdir / f"{name}.txt", "w") as out:
        return subprocess.Popen([PELTBENCH, *arguments], cwd=workdir, env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _until(ready, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert process.poll() is None, "it ended first"
        assert time.monotonic() < deadline, "it did not get there in time"
        time.sleep(0.05)


def _claims(workdir: Path) -> list[dict]:
    found = []
    for path in (workdir / "results").rglob("claim.json"):
        try:
            found.append({**json.loads(path.read_text()), "folder": path.parent})
        except (OSError, ValueError):  # being written
            pass
    return found


def _training(workdir: Path, runs: int) -> bool:
    """`runs` runs claimed and past their first epoch (each has a metrics.csv row)."""
    claimed = _claims(workdir)
    return len(claimed) == runs and all((claim["folder"] / "metrics.csv").is_file() for claim in claimed)


def test_a_worker_killed_with_sigkill_loses_only_its_groups_runs(workdir, in_process):
    grid = ["-m", "method=adapter,lora", "task=rte", "k=16", "seed=111,222", "train.epochs=40", *TINY, TWO_CPUS]
    sweep = _started([*grid, "hydra.sweep.dir=sweeps/a"], workdir, "a")
    try:
        _until(lambda: _training(workdir, 2), sweep)
        victim = _claims(workdir)[0]
        os.kill(victim["pid"], signal.SIGKILL)  # a worker (the claim names its process), mid-training
        status = sweep.wait(timeout=300)
    finally:
        sweep.kill()
    output = (workdir / "a.txt").read_text()
    assert status == 1, output  # a run is not done
    folder = victim["folder"].relative_to(workdir / "results")
    worker = next(line for line in output.splitlines() if "its worker died" in line).split("] ")[1].split(":")[0]
    assert worker in ("cpu-0", "cpu-1")
    summary = output[output.index("peltbench sweep:"):].splitlines()
    assert summary[0] == "peltbench sweep: 4 runs: 3 done (0 of them skipped as already done), 0 failed, 1 missing"
    assert summary[1].startswith(f"  missing  {folder}: the worker on {worker} died (killed by SIGKILL) while "
                                 f"training it (the worker's console: sweeps/a/.workers/"), summary
    assert (victim["folder"] / "claim.json").is_file()  # its process died with it: the next one takes it over

    rerun = in_process(*grid[:-1], "hydra.sweep.dir=sweeps/b", cwd=workdir)  # the same sweep on one device
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"taking over the stale claim on {victim['folder']}" in rerun.stdout
    assert "peltbench sweep: 4 runs: 4 done (3 of them skipped as already done), 0 failed, 0 missing" in rerun.stdout
    assert _claims(workdir) == []


def test_sigterm_stops_every_worker_at_a_checkpoint_and_the_same_command_resumes_them(workdir, in_process):
    tiny = [setting for setting in TINY if not setting.startswith("train.patience=")]
    grid = ["-m", "method=adapter,lora", "task=rte", "k=16", "seed=111", "train.epochs=100000",
            "train.patience=null", *tiny, TWO_CPUS, "hydra.sweep.dir=sweeps/a"]
    sweep = _started(grid, workdir, "first")
    try:
        _until(lambda: _training(workdir, 2), sweep)
        sweep.send_signal(signal.SIGTERM)  # `kill`: to the sweep's process alone, which tells its workers
        status = sweep.wait(timeout=120)
    finally:
        sweep.kill()
    output = (workdir / "first.txt").read_text()
    assert status == 143, output
    assert "SIGTERM: a checkpoint at the end of this training step, then the command stops" in output
    assert output.endswith("peltbench: terminated (SIGTERM): 0 of 2 runs done, 2 not done; rerun the same command to "
                           "run them (done runs are skipped; 2 of them go on from a checkpoint)\n"), output
    assert "Traceback" not in output
    assert len(list((workdir / "results").rglob("checkpoint.pt"))) == 2 and _claims(workdir) == []

    # the same command goes on from both checkpoints; meanwhile a second command on the same results trains nothing
    # (the workers' claims); then Ctrl-C, from a terminal to every process of the command, stops it the same way
    again = _started(grid, workdir, "again")
    try:
        _until(lambda: (workdir / "again.txt").read_text().count("] cpu-") == 2 and
               sum("resume: " in log.read_text() for log in (workdir / "sweeps/a/.workers").glob("*.log")) == 2 and
               len(_claims(workdir)) == 2, again)
        beside = in_process(*grid[:-2], "hydra.sweep.dir=sweeps/beside", cwd=workdir)
        os.killpg(again.pid, signal.SIGINT)
        status = again.wait(timeout=120)
    finally:
        again.kill()
    output = (workdir / "again.txt").read_text()
    assert beside.returncode == 1 and "0 failed, 0 missing, 2 running elsewhere" in beside.stdout, beside.stdout
    assert "] - run: " not in beside.stdout  # it trained nothing
    assert status == 130, output
    assert "Ctrl-C: a checkpoint at the end of this training step, then the command stops (Ctrl-C again" in output
    assert output.endswith("peltbench: interrupted: 0 of 2 runs done, 2 not done; rerun the same command to run them "
                           "(done runs are skipped; 2 of them go on from a checkpoint)\n"), output
    assert _claims(workdir) == []


def test_preflight_refuses_a_bad_device_list_or_a_run_that_names_its_gpu(workdir, in_process):
    grid = ["-m", "method=lora", "task=rte", "k=16", "seed=111,222", *TINY]
    result = in_process(*grid, "hydra.launcher.devices=[cpu,gpu1]", cwd=workdir)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("peltbench: error: hydra.launcher.devices=[cpu,gpu1]: gpu1 is not a device: give cpu or "
                             "cuda:N for each worker (or `all`, every visible GPU)\n")
    result = in_process(*grid, "device=cuda:1", TWO_CPUS, cwd=workdir)
    assert result.returncode == 2 and result.stderr.startswith("peltbench: error: device=cuda:1 with "
                                                               "hydra.launcher.devices=[cpu,cpu]: each worker trains")
    assert not (workdir / "results").exists()
