"""peltbench-missing: the grid as Hydra expands it, each run's record state, and commands that run only the rest."""

from __future__ import annotations

import errno
import itertools
import os
import random
import shlex
import socket
from pathlib import Path

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from conftest import a_record, compose_config
from peltbench import record as record_module
from peltbench.claim import claim_run, describe
from peltbench.missing import Run, Sweep, _load, check_sweep, compact, main, report, with_outcomes, write_outcome
from peltbench.record import config_hash, record_path, write_record

GRID = ["method=adapter,lora", "task=rte,mrpc", "k=100", "seed=111,222"]
EXPERIMENTS = Path(__file__).resolve().parents[1] / "conf" / "experiment"


def write(results: Path, *overrides: str, status: str = "ok", of: tuple[str, ...] = ()) -> Path:
    """The record of the run that `overrides` configure (no training: made up as conftest.a_record makes it), in its
    folder; `of`: overrides of another run whose record it holds instead (another config's record)."""
    cfg = compose_config(*overrides, f"results_dir={results}")
    path = record_path(cfg, results)
    write_record(path, a_record(*(of or overrides), f"results_dir={results}", status=status,
                                finished_at="2026-01-01T00:00:00+00:00",
                                **({} if status == "ok" else {"error": "RuntimeError: out of memory"})))
    return path


def test_the_grid_is_hydras_basic_sweeper_order(tmp_path):
    sweep = _load([*GRID, f"results_dir={tmp_path}"])
    assert sweep.swept_keys == ["method", "task", "seed"]
    assert [run.label for run in sweep.runs] == [
        "adapter/rte/k100/seed111", "adapter/rte/k100/seed222", "adapter/mrpc/k100/seed111", "adapter/mrpc/k100/seed222",
        "lora/rte/k100/seed111", "lora/rte/k100/seed222", "lora/mrpc/k100/seed111", "lora/mrpc/k100/seed222",
    ]
    assert [run.num for run in sweep.runs] == list(range(8))
    assert {run.state for run in sweep.runs} == {"missing"}


def test_sweeper_params_and_a_command_line_key_that_replaces_one(tmp_path):
    # What an +experiment file does: hydra.sweeper.params define the grid, a later key=value narrows it.
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        arguments = ["task=cola", "method=lora", f"results_dir={tmp_path}"]
        sweep_config = loader.load_configuration(config_name="config", overrides=arguments, run_mode=RunMode.MULTIRUN)
        sweep_config.hydra.sweeper.params = {"method": "adapter,lora", "seed": "111,222,333"}
        sweep = check_sweep(loader, sweep_config, arguments)
    assert [run.label for run in sweep.runs] == ["lora/cola/k100/seed111", "lora/cola/k100/seed222", "lora/cola/k100/seed333"]
    assert sweep.swept_keys == ["method", "seed"]
    assert sweep.passthrough == ["task=cola", f"results_dir={tmp_path}"]


@pytest.mark.skipif(not (EXPERIMENTS / "fig2_bottleneck.yaml").is_file(), reason="conf/experiment/fig2_bottleneck.yaml absent")
def test_an_experiment_file_defines_the_grid(tmp_path):
    params = OmegaConf.load(EXPERIMENTS / "fig2_bottleneck.yaml").hydra.sweeper.params
    sizes = [len(str(value).split(",")) for value in params.values()]
    sweep = _load(["+experiment=fig2_bottleneck", f"results_dir={tmp_path}"])
    assert len(sweep.runs) == sizes[0] * sizes[1] * sizes[2] * sizes[3] * sizes[4]
    assert "method.bottleneck" in sweep.swept_keys
    assert len({run.path for run in sweep.runs}) == len(sweep.runs)  # every run has a record path of its own


def test_record_states(tmp_path, monkeypatch):
    done = write(tmp_path, "method=adapter", "task=rte", "seed=111")
    write(tmp_path, "method=adapter", "task=rte", "seed=222", status="failed")
    write(tmp_path, "method=adapter", "task=mrpc", "seed=111",  # another config's record
          of=("method=adapter", "task=mrpc", "seed=111", "method.bottleneck=64"))
    cut = write(tmp_path, "method=lora", "task=rte", "seed=111")
    cut.write_text('{"status": "ok", "conf')  # not a record: missing, a rerun replaces it
    running = record_path(compose_config("method=lora", "task=mrpc", "seed=111"), tmp_path)
    claim = claim_run(running)  # this process is training it
    denied = write(tmp_path, "method=lora", "task=mrpc", "seed=222")
    real_file_bytes = record_module.file_bytes

    def file_bytes(path):
        if path == denied:  # a colleague's record, mode 0600 (root reads anything, so it is simulated)
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_file_bytes(path)

    monkeypatch.setattr(record_module, "file_bytes", file_bytes)
    try:
        sweep = _load([*GRID, f"results_dir={tmp_path}"])
    finally:
        claim.release()
    states = {run.label: run.state for run in sweep.runs}
    assert states == {
        "adapter/rte/k100/seed111": "done", "adapter/rte/k100/seed222": "failed",
        "adapter/mrpc/k100/seed111": "foreign", "adapter/mrpc/k100/seed222": "missing",
        "lora/rte/k100/seed111": "missing", "lora/rte/k100/seed222": "missing",
        "lora/mrpc/k100/seed111": "running", "lora/mrpc/k100/seed222": "unreadable",
    }
    errors = {run.label: run.error for run in sweep.runs if run.error}
    assert errors["adapter/rte/k100/seed222"] == "RuntimeError: out of memory"
    assert errors["adapter/mrpc/k100/seed111"].startswith("method.bottleneck (record 64, this run ")
    assert errors["lora/mrpc/k100/seed111"] == describe(claim.holder)
    assert errors["lora/mrpc/k100/seed222"].startswith(f"cannot read {denied}: Permission denied")
    assert sweep.runs[0].path == done
    lines = report(sweep)
    assert lines[0] == "8 runs: 1 done, 1 failed, 3 missing, 1 running elsewhere, 1 unreadable, 1 held by another config's record"
    assert f"  running  lora/mrpc/k100/seed111: host {socket.gethostname()}, pid {os.getpid()}, started " in "\n".join(lines)
    assert f"  unreadable lora/mrpc/k100/seed222: cannot read {denied}: Permission denied" in "\n".join(lines)


def test_running_and_unreadable_runs_are_not_in_the_commands(tmp_path, capsys):
    for seed in (111, 222):
        write(tmp_path, "method=lora", "task=rte", f"seed={seed}", status="failed")
    with claim_run(record_path(compose_config("method=lora", "task=rte", "seed=222"), tmp_path)):
        assert main(["method=lora", "task=rte", "seed=111,222", f"results_dir={tmp_path}"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "2 runs: 0 done, 1 failed, 0 missing, 1 running elsewhere"
    assert out.splitlines()[-1].strip() == f"peltbench -m method=lora task=rte results_dir={tmp_path} seed=111"


def test_the_summary_gives_a_missing_runs_reason_from_its_log_folder(tmp_path):
    write_outcome(tmp_path / "0_lora", "error", "k=5000 is too large")
    write_outcome(tmp_path / "1_lora", "failed", "could not write the record x: No space left on device")
    runs = [Run(0, {}, "a", tmp_path / "a", "missing", log_dir=tmp_path / "0_lora"),
            Run(1, {}, "b", tmp_path / "b", "missing", log_dir=tmp_path / "1_lora"),
            Run(2, {}, "c", tmp_path / "c", "missing", log_dir=tmp_path / "2_lora"),
            Run(3, {}, "d", tmp_path / "d", "done", log_dir=tmp_path / "0_lora")]
    sweep = with_outcomes(Sweep(runs, []))
    assert [(run.state, run.error) for run in sweep.runs] == [
        ("missing", "k=5000 is too large"), ("failed", "could not write the record x: No space left on device"),
        ("missing", None), ("done", None)]
    assert report(sweep, logs=True)[1:] == [
        f"  missing  a: k=5000 is too large (no record; its log: {tmp_path / '0_lora'})",
        "  failed   b: could not write the record x: No space left on device",
        f"  missing  c (no record: a config error or a killed job; its log: {tmp_path / '2_lora'})"]


def test_the_summary_counts_runs_skipped_as_running_elsewhere(tmp_path):
    for folder in ("0_lora", "1_lora", "2_lora"):  # as the job of a run another process was training writes it
        write_outcome(tmp_path / folder, "running", "another process was training it when this sweep reached it")
    write_outcome(tmp_path / "3_lora", "skipped")
    runs = [Run(0, {}, "a", tmp_path / "a", "done", log_dir=tmp_path / "0_lora"),
            Run(1, {}, "b", tmp_path / "b", "missing", log_dir=tmp_path / "1_lora"),  # the other process died
            Run(2, {}, "c", tmp_path / "c", "running", "host x, pid 1", log_dir=tmp_path / "2_lora"),
            Run(3, {}, "d", tmp_path / "d", "done", log_dir=tmp_path / "3_lora")]
    sweep = with_outcomes(Sweep(runs, []))
    assert [run.elsewhere for run in sweep.runs] == [True, True, True, False]
    assert report(sweep, logs=True, skips=True) == [
        "4 runs: 2 done (1 of them skipped as already done, 1 skipped as running elsewhere and finished there), "
        "0 failed, 1 missing, 1 running elsewhere",
        f"  missing  b: another process was training it when this sweep reached it (no record; its log: "
        f"{tmp_path / '1_lora'})",
        "  running  c: host x, pid 1"]


def test_skipped_counts_what_the_jobs_found_done_whenever_the_record_was_written(tmp_path):
    """Issue 21, 3d: a sweep started beside an identical one said "0 of them skipped as already done" while its
    progress said 9 skipped: it counted records written before it began, and the other sweep wrote them after."""
    write_outcome(tmp_path / "0", "skipped")
    write_outcome(tmp_path / "1", "ok")
    write_outcome(tmp_path / "1", "skipped")  # a requeued SLURM job skips the run it trained before: still its own
    write_outcome(tmp_path / "2", "error", "stale, from an earlier sweep in this folder")
    write_outcome(tmp_path / "2", "ok")
    runs = [Run(num, {}, str(num), tmp_path / f"r{num}", "done", log_dir=tmp_path / str(num)) for num in range(3)]
    sweep = with_outcomes(Sweep(runs, []))
    assert [run.skipped for run in sweep.runs] == [True, False, False]
    assert report(sweep, skips=True) == ["3 runs: 3 done (1 of them skipped as already done), 0 failed, 0 missing"]


def test_a_done_run_without_the_file_its_sweep_saves_is_not_done(tmp_path):
    """Issue 21, 3l: the runner trains it again (save.predictions=true and no predictions.csv), so the sweep's first
    line, its summary and peltbench-missing count it as to run, with the reason."""
    path = write(tmp_path, "method=adapter", "task=rte", "k=100", "seed=111")
    write(tmp_path, "method=adapter", "task=rte", "k=100", "seed=222")
    (path.parent / "predictions.csv").write_text("index,label\n")
    sweep = _load(["method=adapter", "task=rte", "k=100", "seed=111,222", "save.predictions=true",
                   f"results_dir={tmp_path}"])
    assert [(run.state, run.error) for run in sweep.runs] == [
        ("done", None),
        ("missing", "done, but without the predictions.csv this sweep asks for: it trains again")]
    assert report(sweep, logs=True)[1] == ("  missing  adapter/rte/k100/seed222: done, but without the predictions.csv "
                                           f"this sweep asks for: it trains again (its log: {sweep.runs[1].log_dir})")
    assert _load(["method=adapter", "task=rte", "k=100", "seed=111,222", f"results_dir={tmp_path}"]).count("done") == 2


def test_the_printed_commands_run_exactly_what_is_missing(tmp_path, capsys):
    for seed in (111, 222):
        write(tmp_path, "method=adapter", "task=rte", f"seed={seed}")
        write(tmp_path, "method=lora", "task=rte", f"seed={seed}")
    write(tmp_path, "method=adapter", "task=mrpc", "seed=111")
    write(tmp_path, "method=lora", "task=mrpc", "seed=222", status="failed")
    arguments = [*GRID, f"results_dir={tmp_path}", "hydra/launcher=slurm", "hydra.launcher.partition=gpu"]
    assert main(["-m", *arguments]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "8 runs: 5 done, 1 failed, 2 missing"
    assert "  failed   lora/mrpc/k100/seed222: RuntimeError: out of memory" in out
    assert "  missing  adapter/mrpc/k100/seed222" in out and "  missing  lora/mrpc/k100/seed111" in out
    commands = [line.strip() for line in out.splitlines() if line.startswith("  peltbench -m ")]
    # adapter/mrpc lacks 222; lora/mrpc lacks 111 and 222: two commands, the seeds grouped.
    assert commands == [
        f"peltbench -m k=100 results_dir={tmp_path} hydra/launcher=slurm hydra.launcher.partition=gpu "
        "method=adapter task=mrpc seed=222",
        f"peltbench -m k=100 results_dir={tmp_path} hydra/launcher=slurm hydra.launcher.partition=gpu "
        "method=lora task=mrpc seed=111,222",
    ]
    rerun = [run.label for command in commands for run in _load(shlex.split(command)[2:]).runs]
    assert sorted(rerun) == ["adapter/mrpc/k100/seed222", "lora/mrpc/k100/seed111", "lora/mrpc/k100/seed222"]


def test_nothing_missing_exits_0(tmp_path, capsys):
    for seed in (111, 222):
        write(tmp_path, "method=lora", "task=rte", f"seed={seed}")
    assert main(["method=lora", "task=rte", "seed=111,222", f"results_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "2 runs: 2 done, 0 failed, 0 missing"


def test_a_bad_argument_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["method=adaptr,lora", "task=rte", f"results_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("peltbench-missing: error:") and "adaptr" in err and len(err.strip().splitlines()) == 1


def test_ctrl_c_while_a_big_grid_composes_is_one_line_and_exit_130(monkeypatch, capsys):
    import peltbench.missing

    def interrupted(arguments):
        raise KeyboardInterrupt

    monkeypatch.setattr(peltbench.missing, "_load", interrupted)
    assert main(["+experiment=table1"]) == 130
    assert capsys.readouterr() == ("", "peltbench-missing: interrupted\n")


@pytest.mark.parametrize("arguments,line", [
    (["method=lora", "task=rte", "seed=111,-1"], "seed=-1: must be a non-negative integer"),
    (["task=rte,mrpc"], "method= is required: one of adalora, adapter,"),
])
def test_a_run_that_cannot_be_is_a_bad_argument_not_a_missing_run(arguments, line, tmp_path, capsys):
    assert main([*arguments, f"results_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.startswith(f"peltbench-missing: error: {line}")


def test_compact_covers_exactly_the_points_with_few_commands():
    keys = ["method", "task", "k", "seed"]
    grid = {"method": ["adapter", "lora", "ft"], "task": ["rte", "mrpc", "cola"], "k": ["100", "1000"],
            "seed": ["111", "222", "333", "444", "555"]}
    points = [dict(zip(keys, values)) for values in itertools.product(*grid.values())]
    assert compact(points, keys, grid) == [{key: grid[key] for key in keys}]  # the whole grid: one command
    rng = random.Random(0)
    for size in (1, 7, 40, 89):
        subset = rng.sample(points, size)
        boxes = compact(subset, keys, grid)
        covered = [dict(zip(keys, values)) for box in boxes for values in itertools.product(*box.values())]
        assert sorted(map(str, covered)) == sorted(map(str, subset))  # exactly the subset, each point once
        assert len(boxes) <= size
    # one seed lacking in every method/task/k: a single command
    lacking = [p for p in points if p["seed"] == "333"]
    assert compact(lacking, keys, grid) == [{**grid, "seed": ["333"]}]


def test_the_sweep_summary_pickles_in_the_middle_of_a_job():
    """SLURM's pre-timeout signal pickles the launcher (callbacks included) while a job runs."""
    import logging
    import pickle

    from omegaconf import OmegaConf

    from peltbench.missing import SweepSummary

    summary = SweepSummary()
    summary.on_job_start(OmegaConf.create({}))  # the job's error handler (it holds a lock) is attached
    try:
        copy = pickle.loads(pickle.dumps(summary))
    finally:
        logging.getLogger("peltbench").removeHandler(summary.errors)
    assert copy.errors is None and summary.errors is not None and copy.limit == summary.limit


PLAIN_GRIDS = [
    ["method=lora,adapter", "task=rte,cola", "k=100,all", "seed=111,222", "method.lr=1e-4,0.0005", "train.epochs=3"],
    ["protocol=lmbff", "method=lora", "task=cola,rte", "seed=13,100", "k=16"],        # model_seed: ${seed}
    ["protocol=lmbff", "method=lora", "task=cola", "seed=13,21", "model_seed=7"],       # the link overridden
    ["method=prefix", "task=sst2", "seed=1,2", "+method.prefix_projection=false", "~method.prefix_hidden"],  # +, ~
    ["method=lora", "task=rte", "seed=1,2", "logger=csv", "method.lora_targets=[query,key]"],  # a list: OmegaConf
    ["method=adapter", "task=mrpc", "seed=1,2", "hydra.sweep.subdir=${hydra.job.num}-${method.lr}_${train.epochs}"],
    ["method=adapter", "task=mrpc", "seed=1,2", "hydra.sweep.subdir=${now:%H}_${hydra.job.num}"],  # a resolver
]


@pytest.mark.parametrize("grid", PLAIN_GRIDS, ids=lambda grid: grid[0] if "=" in grid[0] else "grid")
def test_a_sweeps_runs_as_plain_data_are_what_hydra_composes(grid, tmp_path):
    """missing._Composer gives a run made of values set on values as plain data (plain.Plain): the same config, record
    path, hash, log folder and check as Hydra's own function on a DictConfig gives it."""
    from peltbench.config import check_config
    from peltbench.missing import _Composer, _check_run, expand
    from peltbench.overrides import pin_group_settings
    from peltbench.record import Plain, config_hash, container

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        pinned = pin_group_settings(["-m", *grid, f"results_dir={tmp_path}"])[1:]
        sweep_config = loader.load_configuration(config_name="config", overrides=pinned, run_mode=RunMode.MULTIRUN)
        jobs, _ = expand(loader, sweep_config)
        plain, hydra = _Composer(loader, sweep_config), _Composer(loader, sweep_config, plain=False)
        kinds = set()
        for num, job in enumerate(jobs):
            fast, slow = plain(list(job), num), hydra(list(job), num)
            kinds.add(type(fast))
            assert container({**fast, "hydra": None}) == OmegaConf.to_container(slow, resolve=True) | {"hydra": None}
            assert config_hash(fast) == config_hash(slow) and record_path(fast, tmp_path) == record_path(slow, tmp_path)
            assert _check_run(fast, num, {}).log_dir == _check_run(slow, num, {}).log_dir
            check_config(fast), check_config(slow)
    assert kinds == ({Plain} if grid in PLAIN_GRIDS[:3] or "-${method.lr}_" in grid[-1] else {OmegaConf.create({}).__class__})


def test_runs_that_put_the_same_values_in_a_dict_share_it(tmp_path):
    """The runs of one set of choices that put the same values in a dict (their method's lr; data.dir, which every run
    sets) share that dict, so what is answered once per node serves them all; values equal in Python but not in a
    record (1, 1.0 and true; 0.0 and -0.0) are never shared: each run's value, type and hash are Hydra's."""
    from peltbench.missing import _Composer, expand
    from peltbench.record import config_hash

    grid = ["method=lora", "task=rte", "seed=1,2", "method.lr=1,1.0,true,0.0,-0.0,1", f"data.dir={tmp_path / 'glue'}"]
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        sweep_config = loader.load_configuration(config_name="config", overrides=grid, run_mode=RunMode.MULTIRUN)
        jobs, _ = expand(loader, sweep_config)
        plain, hydra = _Composer(loader, sweep_config), _Composer(loader, sweep_config, plain=False)
        methods, data = {}, set()
        for num, job in enumerate(jobs):
            fast, slow = plain(list(job), num), hydra(list(job), num)
            assert repr(fast.method.lr) == repr(slow.method.lr) and config_hash(fast) == config_hash(slow)
            methods.setdefault(repr(fast.method.lr), set()).add(id(fast.method))
            data.add(id(fast.data))
    assert sorted(methods) == ["-0.0", "0.0", "1", "1.0", "True"] and len(jobs) == 12
    assert all(len(nodes) == 1 for nodes in methods.values()) and len(set.union(*methods.values())) == 5
    assert len(data) == 1


def test_a_bad_value_is_refused_alike_in_plain_data(tmp_path):
    from peltbench import UserError
    from peltbench.config import check_config
    from peltbench.missing import _Composer, expand

    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for grid, line in ((["method=lora", "task=rte", "seed=1,-1"], "seed=-1: must be a non-negative integer"),
                           (["method=lora", "task=rte", "seed=1,2", "method.lora_rank=0,4"], "method.lora_rank=0"),
                           (["method=lora", "task=rte", "seed=1,2", "train.epochs=null"], "train.epochs=null")):
            sweep_config = loader.load_configuration(config_name="config", overrides=grid, run_mode=RunMode.MULTIRUN)
            jobs, _ = expand(loader, sweep_config)
            errors = []
            for composer in (_Composer(loader, sweep_config), _Composer(loader, sweep_config, plain=False)):
                with pytest.raises(UserError) as error:
                    for num, job in enumerate(jobs):
                        check_config(composer(list(job), num))
                errors.append(str(error.value))
            assert errors[0] == errors[1] and errors[0].startswith(line), errors


def _nodes(cfg, path=""):
    """Every container node of `cfg` with its flags and types: what to_yaml does not show."""
    from omegaconf import DictConfig, ListConfig

    found = [(path, sorted(cfg._metadata.flags.items()), cfg._metadata.object_type, cfg._metadata.ref_type)]
    if isinstance(cfg, DictConfig) and not cfg._is_none() and not cfg._is_missing():
        for key in cfg.keys():
            node = cfg._get_node(key)
            if isinstance(node, (DictConfig, ListConfig)):
                found += _nodes(node, f"{path}.{key}")
    return found


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=global"]])
def test_a_sweeps_sets_of_choices_compose_what_hydra_composes_alone(launcher, monkeypatch, tmp_path):
    """A sweep's sets of choices parse each config file once (_files_parsed_once) and merge Hydra's own part once
    (_HydraPart): each composed config is the one Hydra composes alone, hydra node, flags and all, none shares a node
    with another (a copy each time), and Hydra's own files are loaded once for all the sets."""
    from hydra._internal.config_repository import ConfigRepository

    from peltbench.launchers import register_launchers
    from peltbench.missing import _files_parsed_once, _HydraPart

    register_launchers()
    (tmp_path / "hydra" / "launcher").mkdir(parents=True)  # a launcher file that sets a top-level key too: merged
    (tmp_path / "hydra" / "launcher" / "global.yaml").write_text(  # after Hydra's part, a copy each time
        "# @package _global_\nhydra:\n  launcher:\n    _target_: hydra._internal.core_plugins.basic_launcher.BasicLauncher\n"
        "notes:\n  launcher: mine\n")
    with initialize_config_module(config_module="peltbench.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        sweep_config = loader.load_configuration(config_name="config", run_mode=RunMode.MULTIRUN,
                                                 overrides=["method=lora,adapter", "task=rte", *launcher,
                                                            f"hydra.searchpath=[file://{tmp_path}]"])
        choices = [["method=lora", "task=rte"], ["method=adapter", "task=cola", "protocol=lmbff"],
                   ["method=unipelt_apl", "task=stsb"], ["method=lora", "task=cola", "protocol=lmbff"],
                   ["+experiment=glue/deberta_v3_base_lr/lora", "task=mrpc"],  # its own `hydra:`, after Hydra's part
                   [*(["hydra/launcher=slurm"] if not launcher else []), "method=bitfit", "task=rte"]]  # another part
        alone = [loader.load_sweep_config(sweep_config, list(c)) for c in choices]
        loads = []
        load_config = ConfigRepository.load_config
        monkeypatch.setattr(ConfigRepository, "load_config",
                            lambda repo, config_path: loads.append(config_path) or load_config(repo, config_path))
        part = _HydraPart()
        with _files_parsed_once(), part.active():
            once = [loader.load_sweep_config(sweep_config, list(c)) for c in choices]
            once[0].method.lr = 123.0  # a copy: the next composition of the file is not changed
            once[0].hydra.job.name = "changed"
            if "notes" in once[0]:
                once[0].notes.launcher = "changed"
            again = loader.load_sweep_config(sweep_config, list(choices[0]))
    assert [OmegaConf.to_yaml(cfg) for cfg in [again, *once[1:]]] == [OmegaConf.to_yaml(cfg) for cfg in alone]
    assert [_nodes(cfg) for cfg in [again, *once[1:]]] == [_nodes(cfg) for cfg in alone]
    hydra_files = [path for path in loads if path.startswith("hydra/")]
    assert "hydra/config" in hydra_files and len(hydra_files) == len(set(hydra_files))  # each once for all the sets


def test_the_command_leaves_its_callers_sigpipe_as_it_found_it(tmp_path, capsys):
    """`peltbench-missing ... | head` dies quietly of SIGPIPE, but only while it runs: a process that called main() (a
    test, a notebook) keeps Python's handling, where a closed pipe is an OSError. Left at the default, a sweep started
    in that process later died of SIGPIPE when it told a worker that had ended that there was no more (issue 59)."""
    import signal

    before = signal.getsignal(signal.SIGPIPE)
    assert main(["method=lora", "task=rte", f"results_dir={tmp_path}"]) == 1
    assert signal.getsignal(signal.SIGPIPE) == before == signal.SIG_IGN
    assert "missing" in capsys.readouterr().out
