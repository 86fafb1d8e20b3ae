"""`peltbench -m ...` on Hydra's basic launcher: killed and resumed, its end-of-sweep summary, concurrent sweeps."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peltbench import missing

PELTBENCH = str(Path(sys.executable).with_name("peltbench"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
TINY = ["model.name=tiny-bert", "data.dir=glue", "dev_size=20", "train.patience=50", "results_dir=results"]
GRID = ["-m", "method=adapter,lora", "task=rte", "k=16", "seed=111,222", "train.epochs=10", *TINY]


def records(workdir: Path) -> list[Path]:
    return sorted((workdir / "results").rglob("result.json"))


def check_records(workdir: Path, runs: int) -> list[dict]:
    """Exactly `runs` run folders, each with one complete record of status ok."""
    paths = records(workdir)
    assert len(paths) == runs == len({path.parent for path in paths})
    loaded = [json.loads(path.read_text()) for path in paths]
    assert [record["status"] for record in loaded] == ["ok"] * runs
    return loaded


def test_a_sweep_killed_with_sigkill_is_finished_by_running_it_again(workdir, in_process):
    sweep = subprocess.Popen([PELTBENCH, *GRID, "hydra.sweep.dir=sweeps/killed"], cwd=workdir, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not records(workdir) and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    sweep.send_signal(signal.SIGKILL)  # kill -9 right after the first record: the next run is under way
    sweep.wait()
    finished = {path.parent for path in records(workdir)}
    assert 1 <= len(finished) < 4

    rerun = in_process(*GRID, "hydra.sweep.dir=sweeps/rerun", cwd=workdir)
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output
    check_records(workdir, 4)
    # the runs finished before the kill got no job (no Hydra job folder, no training, no folder at all); the others
    # ran in jobs of their own
    jobs = sorted(path for path in (workdir / "sweeps/rerun").iterdir() if path.is_dir())
    outcomes = [json.loads((job / "outcome.json").read_text())["status"] for job in jobs]
    assert outcomes == ["ok"] * (4 - len(finished)) and all((job / ".hydra").is_dir() for job in jobs)
    trained = {Path(line.split("run: ", 1)[1]) for line in output.splitlines() if "] - run: " in line}
    assert trained == {path.parent for path in records(workdir)} - finished
    assert (f"peltbench sweep: 4 runs: 4 done ({len(finished)} of them skipped as already done), 0 failed, 0 missing"
            in output)
    progress = [line.split("] ", 1)[1] for line in output.splitlines() if " of 4 done" in line]
    skipped = len(finished)  # the runs done before the kill come first in the grid: one line says they are done
    assert [line.split(" · ")[0] for line in progress] == [
        f"runs 1-{skipped} of 4 done ({skipped} skipped)" if skipped > 1 else "run 1 of 4 done (1 skipped)",
        *(f"run {i} of 4 done ({skipped} skipped)" for i in range(skipped + 1, 5))]
    assert all(re.fullmatch(r"(\d+m)?\d+s elapsed", line.split(" · ")[1]) for line in progress)
    assert [line.split(" · ")[2:] != [] for line in progress] == [False] + [True] * (3 - skipped) + [False]


def test_a_fused_member_releases_its_claim_when_its_record_is_written(workdir):
    """Issue 21, 3b: a fused group held every member's claim until the whole group ended, so after a kill -9 the
    members already finished kept a dead claim.json for good (docs/record.md: it exists only while a run trains)."""
    # the second member trains on until killed: no early stop (on an idle machine 51 tiny epochs take 0.5 s)
    tiny = [setting for setting in TINY if not setting.startswith("train.patience=")]
    grid = ["-m", "method=adapter", "task=rte", "k=16", "seed=111", "train.epochs=1,100000", "train.patience=100000",
            "fuse=true", *tiny]
    sweep = subprocess.Popen([PELTBENCH, *grid, "hydra.sweep.dir=sweeps/fused"], cwd=workdir, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not records(workdir) and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        [finished] = records(workdir)  # the 1-epoch member; the other trains on
        assert json.loads(finished.read_text())["fused"]["size"] == 2
        time.sleep(0.5)  # the instant between writing the record and releasing the claim
        assert sweep.poll() is None
    finally:
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
    assert not (finished.parent / "claim.json").exists()
    [training] = [path for path in (workdir / "results").glob("*/rte/k16/seed111") if path != finished.parent]
    assert (training / "claim.json").exists()  # its run had not finished: the next sweep takes the dead claim over

    # Issue 32, 6: the same command takes over what kill -9 left and trains the run; `kill -TERM` (what SLURM sends)
    # then ends it as Ctrl-C does: one line, status 143, the claims released; issue 47: at the end of the step, with a
    # checkpoint in the stopped run's folder (kill -9 came before the first one was due: it started over)
    status, out, err = interrupt(workdir, [*grid, "hydra.sweep.dir=sweeps/again"],
                                 lambda: "epoch 1/100000" in (workdir / "stdout.txt").read_text(), signal.SIGTERM)
    assert status == 143, out + err
    assert "2 runs: 1 already done (skipped), 1 to train\n" in out and f"taking over the stale claim on {training}" in out
    assert "resume: " not in out
    assert err == ("peltbench: terminated (SIGTERM): 1 of 2 runs done, 1 not done; rerun the same command to run them "
                   "(done runs are skipped; 1 of them go on from a checkpoint)\n")
    assert list((workdir / "results").rglob("claim.json")) == []
    assert sorted((workdir / "results").glob("*/rte/k16/seed111")) == sorted([finished.parent, training])
    assert (training / "checkpoint.pt").is_file() and not (training / "result.json").exists()


def test_the_end_of_a_sweep_lists_what_failed_and_exits_1(workdir, in_process):
    # 4 runs: max_length 256 cannot hold a long test row (the tiny model has 128 positions: found once its rows are
    # tokenised, a failed record says why); a model that is not there is bad input only its runs find (no record).
    test_file = workdir / "glue" / "RTE" / "dev.tsv"
    lines = test_file.read_text().splitlines()
    lines[1] = "\t".join([lines[1].split("\t")[0], " ".join(["the dog sat on the mat"] * 40), "a cat", "entailment"])
    test_file.write_text("\n".join(lines) + "\n")
    sweep = ["-m", "method=adapter", "task=rte", "k=16", "train.max_length=256,64", "train.epochs=2", *TINY,
             "model.name=tiny-bert,nowhere/", "hydra.sweep.dir=sweeps/failing"]
    result = in_process(*sweep, cwd=workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    summary = output[output.index("peltbench sweep:"):].splitlines()
    variant = "adapter,dev_size=20,model.name={},train.epochs=2,train.patience=50,train.max_length={}"
    assert summary[0] == "peltbench sweep: 4 runs: 1 done (0 of them skipped as already done), 1 failed, 2 missing"
    assert summary[1] == (f"  failed   {variant.format(f'{workdir.name}_tiny-bert', 256)}/rte/k16/seed111: "
                          "method=adapter task=rte: the longest row's 245 tokens = 245 positions, but the model has 128 "
                          "(max_position_embeddings): set train.max_length=128 or lower")
    for line, length in zip(summary[2:4], (256, 64)):  # the reason, from the job's outcome.json
        assert line.startswith(f"  missing  {variant.format('nowhere', length)}/rte/k16/seed111: could not load model "
                               f"'nowhere/'"), line
        assert "(no record; its log: sweeps/failing/" in line
    assert summary[4].startswith("Rerun the same command to run the failed and missing ones (done runs are skipped): peltbench -m ")
    assert len(summary) == 5


def test_k_above_the_training_pool_stops_the_sweep_before_it_starts(workdir, in_process):
    """Issue 46: a K the task's rows cannot give (k + dev_size above the training pool) is found when the command
    reads the task's data, before the first run: one line, exit status 2, nothing started."""
    sweep = ["-m", "method=adapter", "task=rte", "k=16,50", "train.epochs=2", *TINY, "hydra.sweep.dir=sweeps/k"]
    result = in_process(*sweep, cwd=workdir)
    assert result.returncode == 2
    assert result.stderr == ("peltbench: error: task=rte: k=50 is too large: the train split has 60 rows and k + "
                             "dev_size (50 + 20) must not exceed it\n")
    assert not (workdir / "sweeps").exists() and not (workdir / "results").exists()


def test_hydras_sweeper_does_not_compose_again_the_runs_peltbench_checked(workdir, in_process, monkeypatch):
    """Issue 39: `peltbench -m` composes and checks every run before Hydra starts; Hydra's sweeper (hydra/sweeper=
    peltbench) then does not compose each batch again (~0.1 s a run: hours for 100,000), Hydra's own overrides
    (hydra.sweep.dir, a launcher) included. A sweep peltbench did not check is composed by Hydra, as before."""
    from hydra.core.plugins import Plugins

    from peltbench import cli

    Plugins.instance()  # Hydra's plugin scan executes the plugins' modules again: patch the classes it leaves
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    composed = []
    validate = BasicSweeper.validate_batch_is_legal
    monkeypatch.setattr(BasicSweeper, "validate_batch_is_legal",
                        lambda self, batch: composed.append(len(batch)) or validate(self, batch))
    sweep = ["-m", "method=adapter", "task=rte", "k=16", "seed=111,222", "train.epochs=1", *TINY,
             "hydra.sweep.dir=sweeps/once"]
    result = in_process(*sweep, cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    check_records(workdir, 2)
    assert composed == []

    monkeypatch.setattr(cli, "checked_sweep", lambda: None)  # as if peltbench had not checked it (e.g. -cd DIR)
    result = in_process(*sweep, cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert composed == [2] and "2 runs: 2 already done (skipped), 0 to train" in result.stdout, result.stdout + result.stderr


def test_two_identical_sweeps_started_together_train_each_run_once(workdir):
    grid = ["-m", "method=adapter,lora", "task=rte", "k=16", "seed=111,222", "train.epochs=30", *TINY]
    sweeps = [subprocess.Popen([PELTBENCH, *grid], cwd=workdir, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [sweep.communicate(timeout=300)[0] for sweep in sweeps]
    trained = [line for output in outputs for line in output.splitlines() if "[INFO] - run: " in line]
    assert len(trained) == 4, outputs  # each run trained by one sweep; the other skipped it (done, or claimed)
    check_records(workdir, 4)
    assert all(sorted(os.listdir(path.parent)) == [".lock", "metrics.csv", "result.json"]  # claims gone
               for path in records(workdir))
    for sweep, output in zip(sweeps, outputs):
        summary = output[output.index("peltbench sweep:"):].splitlines()
        if sweep.returncode == 1:  # it ended while the other was still training a run it had skipped
            assert ", 0 failed, 0 missing, " in summary[0] and "running elsewhere" in summary[0], output
            assert all(line.startswith("  running  ") for line in summary[1:-1]), output
        else:
            assert sweep.returncode == 0 and "4 runs: 4 done" in summary[0], output
    assert len(list((workdir / "logs" / "multirun").glob("*/*"))) == 2  # started in one second, a log folder each


def test_a_run_claimed_by_a_live_process_is_not_run_and_the_summary_says_where(workdir, monkeypatch, in_process):
    from conftest import compose_config
    from peltbench.record import record_path

    monkeypatch.chdir(workdir)
    args = ["method=adapter", "task=rte", "k=16", "seed=111", "train.epochs=2", *TINY]
    held = record_path(compose_config(*args), workdir / "results")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from peltbench.claim import claim_run; c = claim_run(Path(sys.argv[1])); "
                               "print('got' if c else 'none', flush=True); time.sleep(120)", str(held)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "got"
        result = in_process("-m", *args[:3], "seed=111,222", *args[4:], "hydra.sweep.dir=sweeps/held", cwd=workdir)
    finally:
        holder.kill()
        holder.wait()
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"skip: {held.parent} is being run by another process (host " in output
    summary = output[output.index("peltbench sweep:"):].splitlines()
    assert summary[0] == "peltbench sweep: 2 runs: 1 done (0 of them skipped as already done), 0 failed, 0 missing, " \
                         "1 running elsewhere"
    assert summary[1].startswith(f"  running  {held.parent.relative_to(workdir / 'results')}: host ")
    assert f", pid {holder.pid}, started " in summary[1]
    assert summary[2].startswith("Runs running elsewhere are another process's: peltbench-missing")
    assert not held.exists()


def test_a_run_skipped_as_running_elsewhere_and_finished_there_is_counted(workdir, monkeypatch):
    from conftest import a_record, compose_config
    from peltbench.record import record_path

    monkeypatch.chdir(workdir)
    args = ["method=adapter", "task=rte", "k=16", "seed=111", "train.epochs=2", *TINY]
    cfg = compose_config(*args)
    held = record_path(cfg, workdir / "results")
    record = a_record(*args)
    holder = subprocess.Popen([sys.executable, "-c", "import json, sys; from pathlib import Path; "
                               "from peltbench.claim import claim_run; from peltbench.record import write_record; "
                               "c = claim_run(Path(sys.argv[1])); print('got' if c else 'none', flush=True); "
                               "sys.stdin.readline(); write_record(Path(sys.argv[1]), json.loads(sys.argv[2]))",
                               str(held), json.dumps(record)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "got"
        sweep = subprocess.Popen([PELTBENCH, "-m", *args[:3], "seed=111,222", *args[4:], "hydra.sweep.dir=sweeps/x"],
                                 cwd=workdir, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = []
        for line in sweep.stdout:
            output.append(line)
            if "is being run by another process" in line:  # the other process finishes while this sweep goes on
                holder.stdin.write("go\n")
                holder.stdin.flush()
                holder.wait(timeout=60)
        sweep.wait(timeout=300)
    finally:
        holder.kill()
        sweep.kill()
    text = "".join(output)
    assert sweep.returncode == 0, text
    assert "run 1 of 2 done (1 running elsewhere)" in text
    assert "peltbench sweep: 2 runs: 2 done (0 of them skipped as already done, 1 skipped as running elsewhere and " \
           "finished there), 0 failed, 0 missing" in text


@pytest.mark.parametrize("fuse,batch", [("false", None), ("true", None), ("false", 3)])
def test_a_rerun_gives_the_runs_done_before_it_no_job(workdir, in_process, monkeypatch, fuse, batch):
    """A sweep run again to finish its last runs trained nothing more, but walked every run done before it through a
    Hydra job of its own (composed again, a log folder, a `skip:` line: ~0.16 s of CPU each, hours for 100,000).
    Now a run done when the sweep starts gets no job, as on SLURM: only the missing run trains, in a fused group
    too (its group trains the members left), and the summary still counts the skips. Issue 48: a skipped run has no
    log folder at all (100,200 of them took 12-17 minutes to delete), and a sweep handed over in batches
    (hydra.sweeper.max_batch_size) is planned and counted as one: one plan line, one progress count (`1000 runs:
    1000 already done` 101 times, `run 976 of 1000` as the first job of a 10,500-run sweep, before)."""
    from peltbench import runner
    from peltbench.record import record_path

    sweep = ["-m", "method=adapter,lora", "task=rte", "k=16", "seed=111,222", "train.epochs=1", f"fuse={fuse}", *TINY]
    first = in_process(*sweep, "hydra.sweep.dir=sweeps/first", cwd=workdir)
    assert first.returncode == 0, first.stdout + first.stderr
    check_records(workdir, 4)
    lost = records(workdir)[2]  # job 2: lora, seed 111
    lost.unlink()

    trained = []
    run_group = runner.run_group
    monkeypatch.setattr(runner, "run_group", lambda cfgs, *args: trained.append(
        [record_path(cfg, workdir / "results") for cfg in cfgs]) or run_group(cfgs, *args))
    batches = [] if batch is None else [f"hydra.sweeper.max_batch_size={batch}"]
    again = in_process(*sweep, *batches, "hydra.sweep.dir=sweeps/again", "hydra.verbose=hydra_plugins", cwd=workdir)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output
    check_records(workdir, 4)
    assert trained == [[lost]]
    jobs = {path.name: path for path in (workdir / "sweeps/again").iterdir() if path.is_dir()}
    assert {name: (json.loads((job / "outcome.json").read_text())["status"], (job / ".hydra").is_dir())
            for name, job in jobs.items()} == {"2_lora_rte_k16_s111": ("ok", True)}  # the skipped runs: no folder
    skips = {Path(line.split("skip: ", 1)[1].split(" is already done")[0]) for line in output.splitlines() if "skip: " in line}
    assert skips == {path.parent for path in records(workdir)} - {lost.parent}  # listed with hydra.verbose
    lines = [line.split("] ", 1)[1] for line in output.splitlines() if "][HYDRA] " in line]
    assert [line for line in lines if " runs: " in line] == ["4 runs: 3 already done (skipped), 1 to train"]
    assert [line.split(" · ")[0] for line in lines if " of 4 done" in line] == [
        "runs 1-3 of 4 done (3 skipped)", "run 4 of 4 done (3 skipped)"]
    assert "run 4 of 4 (#2): " in output  # numbered among the sweep's runs, whichever batch it is in
    assert "peltbench sweep: 4 runs: 4 done (3 of them skipped as already done), 0 failed, 0 missing" in output


def test_a_finished_sweep_run_again_composes_each_choice_once_and_writes_no_folder(workdir, in_process, monkeypatch):
    """Issue 48, 2: a finished sweep run again composed each distinct method × task once in its preflight, once per
    batch of Hydra's (hydra.sweeper.max_batch_size) and once in its summary, wrote a log folder (outcome.json) per
    run, and said `N runs: N already done` once per batch. Now: each set of choices composed once in the command,
    no folder, one plan line and one progress line for the whole sweep, and the summary counts every skip."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from conftest import a_record, compose_config
    from peltbench.record import record_path, write_record

    monkeypatch.chdir(workdir)
    args = ["method=adapter,lora", "task=rte", "k=16", "train.epochs=1", "seed=111,222,333", *TINY]
    for method in ("adapter", "lora"):
        for seed in (111, 222, 333):
            run = [f"method={method}", "task=rte", "k=16", "train.epochs=1", f"seed={seed}", *TINY]
            write_record(record_path(compose_config(*run), workdir / "results"), a_record(*run))
    composed, runs, read = [], [], []
    compose = ConfigLoaderImpl.load_sweep_config
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config",
                        lambda self, config, overrides: composed.append(overrides) or compose(self, config, overrides))
    monkeypatch.setattr(missing._Composer, "__call__", _counted(missing._Composer.__call__, runs))
    monkeypatch.setattr(missing, "read_record", _counted(missing.read_record, read))
    result = in_process("-m", *args, "hydra.sweeper.max_batch_size=2", "hydra.sweep.dir=sweeps/again", cwd=workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert sorted(composed) == [["method=adapter", "task=rte"], ["method=lora", "task=rte"]]  # once each
    assert len(runs) == len(read) == 6  # each run composed and its record read once: the plan is preflight's
    assert not (workdir / "sweeps/again").exists() or not any(path.is_dir() for path in (workdir / "sweeps/again").iterdir())
    lines = [line.split("] ", 1)[1] for line in output.splitlines()
             if "][HYDRA] " in line and "skip: " not in line]  # `skip:` lines show where hydra.verbose was set before
    assert lines[0] == "6 runs: 6 already done (skipped), 0 to train"
    assert [line.split(" · ")[0] for line in lines[1:]] == ["runs 1-6 of 6 done (6 skipped)"]
    assert "peltbench sweep: 6 runs: 6 done (6 of them skipped as already done), 0 failed, 0 missing" in output


def _counted(function, calls: list):
    """`function`, appending its arguments to `calls` at each call."""
    def counted(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)
    return counted


def test_the_sweep_counts_its_skips_as_its_progress_does(workdir, monkeypatch, in_process):
    """Issue 21, 3d and 3l: a sweep beside an identical one said "0 of them skipped as already done" while its progress
    said 9 skipped (the other sweep wrote the records after it began); a sweep that retrains done runs lacking the
    predictions it asks for said they were done (skipped), and logged each `rerun:` line twice."""
    from conftest import a_record, compose_config
    from peltbench.record import record_path, write_record

    monkeypatch.chdir(workdir)
    args = ["method=adapter", "task=rte", "k=16", "train.epochs=1", "save.predictions=true", *TINY]
    later = time.time() + 3600
    for seed in (111, 222):
        cfg = compose_config(*args, f"seed={seed}")
        path = record_path(cfg, workdir / "results")
        write_record(path, a_record(*args, f"seed={seed}"))
        if seed == 111:
            (path.parent / "predictions.csv").write_text("index,prediction\n")
        os.utime(path, (later, later))  # as if written by a sweep beside this one, after this one began
    result = in_process("-m", *args, "seed=111,222,333", "hydra.sweep.dir=sweeps/x", cwd=workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "3 runs: 1 already done (skipped), 2 to train" in output  # 222 trains again
    assert output.count("rerun: ") == 1 and f"seed222 is done but has no predictions.csv" in output
    assert "run 3 of 3 done (1 skipped)" in output
    assert "peltbench sweep: 3 runs: 3 done (1 of them skipped as already done), 0 failed, 0 missing" in output


def test_progress_counts_skipped_runs_as_free_in_the_eta(monkeypatch):
    from hydra_plugins.peltbench_local import _progress

    clock = iter([0.0, 100.0, 160.0, 400.0, 1000.0])  # started, then one reading per line
    monkeypatch.setattr(_progress.time, "monotonic", lambda: next(clock))
    progress = _progress.SweepProgress(total=6, to_train=4)  # 2 runs were done before the sweep
    progress.add(["skipped", "skipped"], 1.0)
    assert progress.line(1, 2) == "runs 1-2 of 6 done (2 skipped) · 1m40s elapsed"  # nothing trained yet: no ETA
    progress.add(["ok"], 58.0)
    assert progress.line(3, 3) == "run 3 of 6 done (2 skipped) · 2m40s elapsed · ETA 3m"  # 58 s × 3 left to train
    progress.add(["ok", "failed"], 242.0)  # a fused pair: 2 trained in 242 s
    # (58 + 242) s / 3 trained = 100 s a run, × 1 left to train
    assert progress.line(4, 5) == "runs 4-5 of 6 done (2 skipped, 1 failed) · 6m40s elapsed · ETA 2m"
    progress.add(["ok"], 600.0)
    assert progress.line(6, 6) == "run 6 of 6 done (2 skipped, 1 failed) · 16m40s elapsed"
    assert _progress.duration(7500) == "2h05m" and _progress.duration(59.6) == "1m00s"


def test_the_sweep_plan_counts_only_the_runs_it_will_train_in_its_fused_groups():
    """Issue 26: "16 runs, 4 of them already done or running elsewhere (skipped), 16 in 1 fused groups"."""
    from hydra_plugins.peltbench_local._progress import plan_line

    sixteen = [list(range(16))]
    states = {num: "done" if num < 4 else "missing" for num in range(16)}
    assert plan_line(sixteen, states) == "16 runs: 4 already done (skipped), 12 to train in 1 fused group"
    states.update({4: "running", 5: "failed"})  # a failed run trains again
    assert plan_line(sixteen, states) == "16 runs: 4 already done (skipped), 1 running elsewhere (skipped), 11 to train in 1 fused group"
    # a group with one run left trains it alone; separate runs beside the groups
    packs = [[0, 1, 2], [3, 4], [5, 6], [7], [8]]
    states = {0: "done", 1: "done", 2: "missing", 3: "missing", 4: "missing", 5: "missing", 6: "missing", 7: "done", 8: "foreign"}
    assert plan_line(packs, states) == "9 runs: 3 already done (skipped), 6 to train, 4 of them in 2 fused groups"
    assert plan_line([[0], [1]], {0: "missing", 1: "failed"}) == "2 runs: 2 to train"
    assert plan_line([[0, 1]], {0: "done", 1: "done"}) == "2 runs: 2 already done (skipped), 0 to train"


def test_an_unwritable_results_dir_is_found_before_any_model_loads(workdir, in_process):
    (workdir / "results").write_text("a file, not a folder")
    result = in_process("-m", "method=adapter,lora", "task=rte", "k=16", "train.epochs=2", *TINY,
                        "hydra.sweep.dir=sweeps/unwritable", cwd=workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "epoch 1/" not in output and "trainable parameters" not in output, output
    summary = output[output.index("peltbench sweep:"):].splitlines()
    assert summary[0] == "peltbench sweep: 2 runs: 0 done (0 of them skipped as already done), 0 failed, 2 missing"
    assert summary[1].startswith("  missing  adapter,dev_size=20,model.name=")
    assert f": cannot write the record {workdir}/results/adapter," in summary[1]
    assert summary[1].endswith("(no record; its log: sweeps/unwritable/0_adapter_rte_k16_s111)")
    single = in_process("method=adapter", "task=rte", "k=16", *TINY, cwd=workdir)
    assert single.returncode == 2 and single.stderr.strip().splitlines()[-1].startswith(
        f"peltbench: error: cannot write the record {workdir}/results/adapter,"), single.stderr
    assert single.stderr.strip().endswith(f"{workdir}/results is not a directory")


def test_a_record_that_cannot_be_written_at_the_end_is_a_failed_run_with_its_reason(workdir, monkeypatch, in_process):
    """The disk fills up during training: the summary says so, instead of calling the run missing."""
    import errno

    import peltbench.record as record

    real = record.write_file

    def write_file(path, text, prefix, exclusive=False):
        if prefix == ".result.":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text, prefix, exclusive)

    monkeypatch.setattr(record, "write_file", write_file)
    result = in_process("-m", "method=adapter", "task=rte", "k=16", "train.epochs=2", *TINY,
                        "hydra.sweep.dir=sweeps/full", cwd=workdir)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    summary = output[output.index("peltbench sweep:"):].splitlines()
    assert summary[0] == "peltbench sweep: 1 runs: 0 done (0 of them skipped as already done), 1 failed, 0 missing"
    assert summary[1].startswith("  failed   adapter,dev_size=20,")
    assert summary[1].endswith("/rte/k16/seed111/result.json: No space left on device")
    assert records(workdir) == []


def test_a_run_that_goes_non_finite_leaves_a_record_without_nan(workdir, in_process):
    result = in_process("method=ft", "task=rte", "k=16", "method.lr=1e10", "train.epochs=3", *TINY, cwd=workdir)
    assert result.returncode in (0, 1), result.stderr  # ok with nulls, or failed at the first NaN loss (train.py)
    [path] = records(workdir)
    record = json.loads(path.read_text(), parse_constant=lambda constant: pytest.fail(f"{constant} in {path}"))
    assert record["status"] == "failed" or record["non_finite"]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell's background job ignores SIGINT; a terminal's Ctrl-C reaches it


def interrupt(workdir: Path, arguments: list[str], ready, signum: int = signal.SIGINT) -> tuple[int, str, str]:
    """Run `peltbench ARGUMENTS`, press Ctrl-C (SIGINT; or send `signum`) once `ready()` holds; its exit status,
    stdout and stderr."""
    out, err = workdir / "stdout.txt", workdir / "stderr.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen([PELTBENCH, *arguments], cwd=workdir, env=ENV, stdout=stdout, stderr=stderr,
                                   preexec_fn=_default_sigint)
        deadline = time.monotonic() + 240
        while process.poll() is None and not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, "it ended before Ctrl-C: " + out.read_text() + err.read_text()
        process.send_signal(signum)
        status = process.wait(timeout=60)
    return status, out.read_text(), err.read_text()


def training(workdir: Path) -> bool:
    """A run is under way: it has logged an epoch (metrics.csv) and has no record yet."""
    return any(not (path.parent / "result.json").exists() for path in (workdir / "results").rglob("metrics.csv"))


def test_ctrl_c_ends_a_sweep_with_one_line_and_status_130_and_the_same_command_finishes_it(workdir, in_process):
    """Issue 26, 5: Ctrl-C printed a 90-130-line traceback and exited 1."""
    grid = ["-m", "method=adapter,lora", "task=rte", "k=16", "seed=111", "train.epochs=20", *TINY]
    status, out, err = interrupt(workdir, [*grid, "hydra.sweep.dir=sweeps/a"],
                                 lambda: len(records(workdir)) == 1 and training(workdir))  # lora mid-training
    assert status == 130, out + err
    assert err == ("peltbench: interrupted: 1 of 2 runs done, 1 not done; rerun the same command to run them "
                   "(done runs are skipped; 1 of them go on from a checkpoint)\n")
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    assert "Ctrl-C: a checkpoint at the end of this training step, then the command stops" in out
    [done] = records(workdir)
    assert "/adapter," in str(done) and json.loads(done.read_text())["status"] == "ok"
    assert list((workdir / "results").rglob("claim.json")) == []  # the interrupted run's claim went with it

    rerun = in_process(*grid, "hydra.sweep.dir=sweeps/b", cwd=workdir)
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output
    assert "2 runs: 1 already done (skipped), 1 to train" in output and "from its checkpoint at epoch " in output
    check_records(workdir, 2)
    assert "peltbench sweep: 2 runs: 2 done (1 of them skipped as already done), 0 failed, 0 missing" in output


def test_ctrl_c_in_a_fused_group_keeps_its_finished_members_and_leaves_no_claim(workdir):
    tiny = [setting for setting in TINY if not setting.startswith("train.patience=")]
    grid = ["-m", "method=adapter", "task=rte", "k=16", "seed=111", "train.epochs=1,100000", "train.patience=100000",
            "fuse=true", *tiny]  # the 1-epoch member finishes, the other trains on until Ctrl-C
    status, out, err = interrupt(workdir, [*grid, "hydra.sweep.dir=sweeps/a"], lambda: len(records(workdir)) == 1)
    assert status == 130, out + err
    assert "2 runs: 2 to train in 1 fused group" in out
    assert err == ("peltbench: interrupted: 1 of 2 runs done, 1 not done; rerun the same command to run them "
                   "(done runs are skipped; 1 of them go on from a checkpoint)\n")
    [finished] = records(workdir)
    assert json.loads(finished.read_text())["fused"]["size"] == 2
    assert list((workdir / "results").rglob("claim.json")) == []
    # the stopped member's folder holds its checkpoint (issue 47), no claim and no record
    [stopped] = [path for path in (workdir / "results").glob("*/rte/k16/seed111") if path != finished.parent]
    assert (stopped / "checkpoint.pt").is_file()
    # the same command skips the finished member and goes on with the other at once, in the group it trained in (the
    # finished member's slot inactive): nothing of the first process blocks it
    status, out, err = interrupt(workdir, [*grid, "hydra.sweep.dir=sweeps/b"], lambda: "runs training" in
                                 (workdir / "stdout.txt").read_text().partition("resume: ")[2])
    assert status == 130 and "2 runs: 1 already done (skipped), 1 to train\n" in out, out + err
    assert "resume: a fused group of 2 runs (1 of this job's) from its checkpoint at epoch " in out
    assert "peltbench: interrupted: 1 of 2 runs done, 1 not done;" in err and err.count("\n") == 1
