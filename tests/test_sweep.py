"""`peltbench -m ...` on Hydra's basic launcher: killed and resumed, its end-of-sweep summary, concurrent writers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import write_glue

PELTBENCH = str(Path(sys.executable).with_name("peltbench"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
TINY = ["model.name=tiny-bert", "data.dir=glue", "dev_size=20", "train.patience=50", "results_dir=results"]
GRID = ["-m", "method=adapter,lora", "task=rte", "k=16", "seed=111,222", "train.epochs=40", *TINY]


@pytest.fixture
def workdir(tmp_path, tiny_checkpoint):
    write_glue(tmp_path / "glue")
    shutil.copytree(tiny_checkpoint, tmp_path / "tiny-bert")
    return tmp_path


def peltbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PELTBENCH, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def records(workdir: Path) -> list[Path]:
    return sorted((workdir / "results").rglob("result.json"))


def check_records(workdir: Path, runs: int) -> list[dict]:
    """Exactly `runs` run folders, each with one complete record of status ok."""
    paths = records(workdir)
    assert len(paths) == runs == len({path.parent for path in paths})
    loaded = [json.loads(path.read_text()) for path in paths]
    assert [record["status"] for record in loaded] == ["ok"] * runs
    return loaded


def test_a_sweep_killed_with_sigkill_is_finished_by_running_it_again(workdir):
    sweep = subprocess.Popen([PELTBENCH, *GRID, "hydra.sweep.dir=sweeps/killed"], cwd=workdir, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not records(workdir) and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    sweep.send_signal(signal.SIGKILL)  # kill -9 right after the first record: the next run is under way
    sweep.wait()
    finished = {path.parent for path in records(workdir)}
    assert 1 <= len(finished) < 4

    rerun = peltbench(*GRID, "hydra.sweep.dir=sweeps/rerun", cwd=workdir)
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output
    check_records(workdir, 4)
    skipped = {Path(line.split("skip: ", 1)[1].split(" is already done")[0]) for line in output.splitlines() if "skip: " in line}
    assert skipped == finished  # the runs finished before the kill were skipped, the others ran
    assert (f"peltbench sweep: 4 runs: 4 done ({len(finished)} of them skipped as already done), 0 failed, 0 missing"
            in output)


def test_the_end_of_a_sweep_lists_what_failed_and_exits_1(workdir):
    # 4 runs: max_length 256 fails on a long test row (the tiny model has 128 positions: a `failed` record);
    # k=50 + dev_size=20 > 60 rows is a config error (no record).
    test_file = workdir / "glue" / "RTE" / "dev.tsv"
    lines = test_file.read_text().splitlines()
    lines[1] = "\t".join([lines[1].split("\t")[0], " ".join(["the dog sat on the mat"] * 40), "a cat", "entailment"])
    test_file.write_text("\n".join(lines) + "\n")
    sweep = ["-m", "method=adapter", "task=rte", "k=16,50", "train.max_length=256,64", "train.epochs=2", *TINY,
             "hydra.sweep.dir=sweeps/failing"]
    result = peltbench(*sweep, cwd=workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    summary = output[output.index("peltbench sweep:"):].splitlines()
    variant = "adapter,dev_size=20,model.name=tiny-bert,train.epochs=2,train.patience=50,train.max_length={}"
    assert summary[0] == "peltbench sweep: 4 runs: 1 done (0 of them skipped as already done), 1 failed, 2 missing"
    assert summary[1].startswith(f"  failed   {variant.format(256)}/rte/k16/seed111: RuntimeError: ")  # from the embeddings
    assert summary[2].startswith(f"  missing  {variant.format(256)}/rte/k50/seed111 (no record: a config error or a killed job; "
                                 f"its log: sweeps/failing/2_adapter_rte_k50_s111)")
    assert summary[3].startswith(f"  missing  {variant.format(64)}/rte/k50/seed111 (no record")
    assert summary[4].startswith("Rerun the same command to run the failed and missing ones (done runs are skipped): peltbench -m ")
    assert len(summary) == 5
    assert "k=50 is too large" in output  # the config error itself was logged when its run came up


def test_concurrent_sweeps_on_one_results_dir_leave_one_complete_record_per_run(workdir):
    grid = ["-m", "method=adapter", "task=rte", "k=16", "seed=111,222", "train.epochs=20", *TINY]
    sweeps = [subprocess.Popen([PELTBENCH, *grid, f"hydra.sweep.dir=sweeps/{name}"], cwd=workdir, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in ("a", "b")]
    outputs = [sweep.communicate(timeout=300)[0] for sweep in sweeps]
    assert [sweep.returncode for sweep in sweeps] == [0, 0], outputs
    check_records(workdir, 2)
    assert sorted(os.listdir(records(workdir)[0].parent)) == ["result.json"]  # no temporary file left behind
