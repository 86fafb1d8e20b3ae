"""The local launcher: a sweep's runs one after another in this process, compatible runs fused (`fuse=true`).

Each run it trains keeps its Hydra job (its folder, log and callbacks). The runs of a fused group train in the job
of the group's first run, whose log holds the training; the job of every other member says which group it
trained in. A separate run goes through the task function as on Hydra's basic launcher. After each run (or fused
group) a line says how far the sweep is, with an ETA from the runs trained so far (_progress.py).

The sweep is planned once: every run of every batch (hydra.sweeper.max_batch_size runs) composed and its record
checked, each batch grouped, one line for the whole sweep, and one progress count (`run 10,001 of 10,500`). `peltbench
-m`'s preflight makes the plan as it checks each run's config (peltbench.cli.checked_plan), so each run is composed and
its record read once; the launcher takes it when Hydra hands over the first batch (plan_sweep), or makes it there for a
sweep preflight did not check. A run whose record is done when the sweep starts gets no job (as on SLURM,
where it is not submitted), nor does one whose folder holds a damaged record: no log folder, its JobReturn the
`skipped` (`damaged`) its job would have returned, and the sweep's summary takes it from the plan
(peltbench.missing.note_no_job). So rerunning a finished sweep of 100,000 runs costs its start and its summary, not a
job per run (~0.16 s of CPU each: hours) nor a folder per run. A run being trained elsewhere when the sweep starts
still gets its job: by the time the sweep reaches it, it may be done, or its holder dead (peltbench.runner decides).

With `hydra.launcher.devices` (a list of devices, or `all`) the same plan's packs go to one worker process per device
instead (_pool.py, _worker.py), each trained there by `run_pack` as here.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Sequence, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from peltbench.fusion import fused_packs
from peltbench.interrupts import interrupted, interruption
from peltbench.missing import (NO_JOB_STATES, checked_batches, compose_jobs, expand, interrupted_line,
                               note_no_job)
from peltbench.workers import sweep_devices

from ._progress import SKIPPED_STATES, SweepProgress, plan_line, status

log = logging.getLogger(__name__)

Run = Tuple[List[str], int]  # one run of the sweep: its overrides and its job number


@dataclass
class PeltbenchLocalConf:
    _target_: str = "hydra_plugins.peltbench_local._launcher.PeltbenchLocalLauncher"
    # null: the sweep trains in this process, on each run's `device`; [cuda:0,cuda:1,...], `all` (every visible GPU)
    # or [cpu,cpu] (the cores split between them): one worker process per entry, the plan's groups handed out (_pool.py)
    devices: Any = None


ConfigStore.instance().store(group="hydra/launcher", name="peltbench_local", node=PeltbenchLocalConf,
                             provider="peltbench")


class PeltbenchLocalLauncher(Launcher):
    def __init__(self, devices: Any = None) -> None:
        self.config = self.task_function = self.hydra_context = None
        self.plan: SweepPlan | None = None
        self.devices = devices  # hydra.launcher.devices, as given (peltbench.workers.sweep_devices reads it)

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        runs = [(list(overrides), initial_job_idx + i) for i, overrides in enumerate(job_overrides)]
        batch = self.plan.batch(runs) if self.plan is not None else None
        if batch is None:  # the sweep's first batch (its plan covers every batch), or one the plan did not foresee
            self.plan = plan_sweep(self.hydra_context.config_loader, self.config, runs,
                                   whole=self.plan is None and initial_job_idx == 0)
            batch = self.plan.batch(runs)
        plan = self.plan
        returns = {num: skipped_return(overrides, plan.states[num]) for overrides, num in runs
                   if plan.states[num] in NO_JOB_STATES}
        by_num = {num: (overrides, num) for overrides, num in runs}
        packs = [[by_num[num] for num in pack] for pack in batch.packs]
        alone = [pack for pack in packs if tuple(num for _, num in pack) in batch.alone]
        devices = sweep_devices(self.devices)
        with interruption(lambda: self._interrupted()):  # Ctrl-C: one line (peltbench.cli), how far the sweep got
            if devices is None:
                returns.update(self._run_packs(packs, alone, plan))
            elif packs:
                returns.update(self._run_on_devices(packs, alone, plan, devices))
        return [returns[num] for _, num in runs]

    def _interrupted(self) -> str:
        """Ctrl-C's line: the runs done when the sweep started, and those of the runs it gave a job that are done."""
        assert self.plan is not None and self.hydra_context is not None
        cfgs = compose_jobs(self.hydra_context.config_loader, self.config, [overrides for overrides, _ in self.plan.given])
        return interrupted_line(cfgs, done_before=self.plan.done_before, total=self.plan.total)

    def _run_on_devices(self, packs: List[List[Run]], alone: List[List[Run]], plan: SweepPlan,
                        devices: List[str]) -> dict:
        """Train the packs on one worker process per device (hydra.launcher.devices: _pool.py), longest first."""
        from ._pool import DevicePool

        for pack in packs:
            plan.given.extend(pack)
        work = [plan.pack_work(pack) for pack in packs]
        lone = [index for index, pack in enumerate(packs) if pack in alone]
        pool = DevicePool(self, devices)
        returns = pool.run(packs, work, plan.progress, lone)
        if pool.stopping:  # a stop whose follow-up went on (Ctrl-C's and SIGTERM's never do): the runs left stay so
            raise KeyboardInterrupt
        return returns

    def _run_packs(self, packs: List[List[Run]], alone: List[List[Run]], plan: SweepPlan) -> dict:
        """Train the packs, numbered among the sweep's runs (plan.progress counts those finished)."""
        returns: dict[int, JobReturn] = {}
        progress = plan.progress
        for pack in packs:
            done, total = progress.finished, plan.total
            plan.given.extend(pack)
            nums = ", ".join(f"#{num}" for _, num in pack)
            if len(pack) == 1:
                log.info("run %d of %d (#%d): %s", done + 1, total, pack[0][1], " ".join(filter_overrides(pack[0][0])))
                if pack in alone:
                    log.info("fine-tuning trains alone: it changes the backbone, which fused runs share")
            else:
                log.info("runs %d-%d of %d, fused (%s)", done + 1, done + len(pack), total, nums)
            started = time.monotonic()
            pack_returns = run_pack(self, pack)
            progress.add([status(ret) for ret in pack_returns], time.monotonic() - started)
            for (_, num), ret in zip(pack, pack_returns):
                returns[num] = ret
            if interrupted():  # the run's job caught what Ctrl-C became (Hydra's run_job: any Exception)
                raise KeyboardInterrupt
            log.info("%s", progress.line(done + 1, done + len(pack)))
        return returns


@dataclass
class PlannedBatch:
    """One of Hydra's batches of a sweep (hydra.sweeper.max_batch_size), as planned: its jobs' overrides (to know it
    when it comes), and the job numbers of each pack it trains (a fused group or a run of its own, less its members
    given no job) and of those that train alone although fuse=true (fine-tuning)."""

    jobs: List[Tuple[str, ...]]
    packs: List[List[int]]
    alone: set


@dataclass
class SweepPlan:
    """What a local sweep decided when it started, over all its runs (or, where Hydra handed over a batch the plan did
    not foresee, over that batch): each run's record state (peltbench.missing.STATES), its batches' packs, one
    progress count for all of it, and the runs given a job so far (Ctrl-C's line)."""

    total: int
    states: dict
    batches: dict          # first job number -> PlannedBatch
    progress: SweepProgress
    done_before: int
    given: List[Run] = field(default_factory=list)
    work: dict = field(default_factory=dict)  # job number -> config.planned_work (None: not known before its data)

    def pack_work(self, pack: List[Run]) -> float | None:
        """A pack's planned work: its runs' (a fused group's members' batches and dev rows add up), None if one's is
        not known."""
        works = [self.work.get(num) for _, num in pack]
        return None if any(work is None for work in works) else sum(works)

    def batch(self, runs: List[Run]) -> PlannedBatch | None:
        """The planned batch that `runs` are (the same jobs, numbered alike), or None."""
        planned = self.batches.get(runs[0][1]) if runs else None
        if planned is None or len(planned.jobs) != len(runs):
            return None
        return planned if all(tuple(overrides) == job for (overrides, _), job in zip(runs, planned.jobs)) else None


def plan_sweep(config_loader: Any, sweep_config: DictConfig, runs: List[Run], whole: bool = True) -> SweepPlan:
    """Plan the sweep (`whole`: all its runs, as Hydra will hand them over batch by batch; else the batch `runs`):
    compose every run, check its record, group each batch (fusion.fused_packs: the same groups as before any run is
    left out), and give no job to a run done when it starts, or whose folder holds a damaged record: it returns
    `skipped` (`damaged`) at once, writes no log folder, and the sweep's summary takes it from here (note_no_job).
    A whole sweep that `peltbench -m`'s preflight has just composed, checked and grouped (peltbench.cli.checked_plan)
    is taken from there, not composed again. Logs the plan (one line for the whole sweep) and a count of those runs."""
    from peltbench.cli import checked_plan

    jobs, first, size = [overrides for overrides, _ in runs], runs[0][1] if runs else 0, len(runs)
    checked = None
    if whole:
        every, _ = expand(config_loader, sweep_config)
        if every[:len(runs)] == jobs:  # the batches Hydra's sweeper makes of them (its BasicSweeper's split)
            jobs, first = every, 0
            size = OmegaConf.select(sweep_config, "hydra.sweeper.max_batch_size", default=None) or len(every)
            checked = checked_plan(sweep_config, every, size)
    if checked is None:
        checked = checked_batches(config_loader, sweep_config, jobs, first, size)
    sweep_dir = str(sweep_config.hydra.sweep.dir)
    states: dict = {}
    work: dict = {}
    batches = {}
    listing = log.isEnabledFor(logging.DEBUG)  # hydra.verbose=hydra_plugins lists the runs done
    for batch in checked:
        work.update((run.num, planned) for run, planned in zip(batch.runs, batch.work))
        for run in batch.runs:
            states[run.num] = run.state
            if run.state in NO_JOB_STATES:
                note_no_job(sweep_dir, run)
                if run.state == "done" and listing:
                    log.debug("skip: %s is already done", run.path.parent)
                elif run.state == "damaged":
                    log.warning("skip: %s holds a damaged record: %s; move it away to rerun it", run.path, run.error)

        def left(group: List[int]) -> List[int]:  # a group trains its members not done (peltbench.runner: the same)
            return [batch.start + i for i in group if states[batch.start + i] not in NO_JOB_STATES]

        batches[batch.start] = PlannedBatch(list(batch.jobs), [kept for group in batch.groups if (kept := left(group))],
                                            {tuple(kept) for group, lone in zip(batch.groups, batch.alone)
                                             if lone and (kept := left(group))})
    log.info("%s", plan_line([pack for planned in batches.values() for pack in planned.packs], states))
    progress = SweepProgress(len(states), sum(state not in SKIPPED_STATES for state in states.values()))
    skipped = [("skipped" if state == "done" else state) for state in states.values() if state in NO_JOB_STATES]
    if skipped:
        progress.add(skipped, 0.0)
        log.info("%s", progress.line(1, len(skipped)))
    return SweepPlan(len(states), states, batches, progress, sum(state == "done" for state in states.values()), work=work)


def skipped_return(overrides: Sequence[str], state: str) -> JobReturn:
    """The return of a run that gets no job: done when the sweep started (`skipped`), its folder holding a damaged
    record then (`damaged`), or, on SLURM, another process's (`running`: not submitted). It has no log folder: the
    sweep's summary knows it from its launcher (peltbench.missing.note_no_job)."""
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = "skipped" if state == "done" else state
    return ret


def plan_packs(config_loader: Any, sweep_config: DictConfig, runs: List[Run]) -> Tuple[List[List[Run]], List[List[Run]]]:
    """The runs grouped as they will train (group_packs), their configs composed here."""
    return group_packs(runs, compose_jobs(config_loader, sweep_config, [overrides for overrides, _ in runs]))


def group_packs(runs: List[Run], cfgs: List[DictConfig]) -> Tuple[List[List[Run]], List[List[Run]]]:
    """The runs grouped as they will train: fused groups (fuse=true) and runs of their own, in sweep order;
    and the packs of the fine-tuning runs that could not fuse although fuse=true. `cfgs`: each run's config."""
    groups, alone = fused_packs(cfgs)
    packs = [[runs[i] for i in group] for group in groups]
    return packs, [pack for pack, lone in zip(packs, alone) if lone]


def run_pack(launcher: Any, pack: List[Run], job_id: Any = None) -> List[JobReturn]:
    """Run a pack as Hydra runs jobs: a separate run through the task function, a fused group all at once.

    `job_id`: hydra.job.id of every run (the SLURM job's id); by default each run's job number, as locally.
    """
    configs = []
    for overrides, num in pack:
        config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = num if job_id is None else job_id
            config.hydra.job.num = num
        configs.append(config)
    if len(pack) == 1:
        return [_job(launcher, configs[0], launcher.task_function)]
    outcomes: list = []

    def train_group(_: DictConfig) -> str:
        from peltbench.runner import run_group, sweep_status

        outcomes.extend(run_group([_task_config(config) for config in configs]))
        return sweep_status(outcomes[0])

    def member(position: int) -> Callable[[DictConfig], str]:
        def task(_: DictConfig) -> str:
            from peltbench.runner import sweep_status

            log.info("trained in a fused group with run #%d (its log has the training)", configs[0].hydra.job.num)
            return sweep_status(outcomes[position]) if outcomes else "error"
        return task

    returns = [_job(launcher, configs[0], train_group)]
    returns += [_job(launcher, config, member(position)) for position, config in enumerate(configs) if position]
    return returns


def _job(launcher: Any, config: DictConfig, task_function: Callable) -> JobReturn:
    ret = run_job(hydra_context=launcher.hydra_context, task_function=task_function, config=config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    return ret


def _task_config(config: DictConfig) -> DictConfig:
    """A job's config as its task function sees it (Hydra's run_job: without the `hydra` node)."""
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task
