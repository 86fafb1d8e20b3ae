"""The local launcher: a sweep's runs one after another in this process, compatible runs fused (`fuse=true`).

Each run it trains keeps its Hydra job (its folder, log and callbacks). The runs of a fused group train in the job
of the group's first run, whose log holds the training; the job of every other member says which group it
trained in. A separate run goes through the task function as on Hydra's basic launcher. After each run (or fused
group) a line says how far the sweep is, with an ETA from the runs trained so far (_progress.py).

A run whose record is done when the sweep starts gets no job (as on SLURM, where it is not submitted): its log
folder says `skipped` (outcome.json, for the sweep's summary) and its JobReturn is the `skipped` its job would have
returned, so rerunning a mostly-done sweep of 100,000 runs costs the sweep's start, not a job per done run
(~0.16 s of CPU each: hours). A run being trained elsewhere when the sweep starts still gets its job: by the time
the sweep reaches it, it may be done, or its holder dead (peltbench.runner decides then).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Sequence, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, open_dict, read_write
from peltbench.fusion import plan_groups
from peltbench.interrupts import interrupted, interruption
from peltbench.missing import compose_jobs, interrupted_line, record_runs, write_outcome

from ._progress import NO_JOB_STATES, SKIPPED_STATES, SweepProgress, plan_line, status

log = logging.getLogger(__name__)

Run = Tuple[List[str], int]  # one run of the sweep: its overrides and its job number


@dataclass
class PeltbenchLocalConf:
    _target_: str = "hydra_plugins.peltbench_local._launcher.PeltbenchLocalLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="peltbench_local", node=PeltbenchLocalConf,
                             provider="peltbench")


class PeltbenchLocalLauncher(Launcher):
    def __init__(self) -> None:
        self.config = self.task_function = self.hydra_context = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        runs = [(list(overrides), initial_job_idx + i) for i, overrides in enumerate(job_overrides)]
        cfgs = compose_jobs(self.hydra_context.config_loader, self.config, [overrides for overrides, _ in runs],
                            first_num=initial_job_idx)
        packs, alone = group_packs(runs, cfgs)
        checked = dict(zip((num for _, num in runs), record_runs(cfgs, first_num=initial_job_idx)))
        states = {num: run.state for num, run in checked.items()}
        log.info("%s", plan_line([[num for _, num in pack] for pack in packs], states))
        progress = SweepProgress(len(runs), sum(state not in SKIPPED_STATES for state in states.values()))
        returns = {num: skipped_return(overrides, checked[num]) for overrides, num in runs if states[num] in NO_JOB_STATES}
        for num in returns:
            if states[num] == "done":
                log.debug("skip: %s is already done", checked[num].path.parent)
            else:
                log.warning("skip: %s holds a damaged record: %s; move it away to rerun it", checked[num].path,
                            checked[num].error)
        if returns:
            progress.add([str(ret.return_value) for ret in returns.values()], 0.0)
            log.info("%s", progress.line(1, len(returns)))

        def left(pack: List[Run]) -> List[Run]:  # a group trains its members not done (peltbench.runner: the same)
            return [run for run in pack if run[1] not in returns]

        packs, alone = [kept for pack in packs if (kept := left(pack))], [kept for pack in alone if (kept := left(pack))]
        with interruption(lambda: interrupted_line(cfgs)):  # Ctrl-C: one line (peltbench.cli), how far the sweep got
            returns.update(self._run_packs(runs, packs, alone, progress, len(returns)))
        return [returns[num] for _, num in runs]

    def _run_packs(self, runs: List[Run], packs: List[List[Run]], alone: List[List[Run]],
                   progress: SweepProgress, done: int) -> dict:
        """Train the packs, after `done` runs of the sweep (those done before it started)."""
        returns: dict[int, JobReturn] = {}
        for pack in packs:
            nums = ", ".join(f"#{num}" for _, num in pack)
            if len(pack) == 1:
                log.info("run %d of %d (#%d): %s", done + 1, len(runs), pack[0][1], " ".join(filter_overrides(pack[0][0])))
                if pack in alone:
                    log.info("fine-tuning trains alone: it changes the backbone, which fused runs share")
            else:
                log.info("runs %d-%d of %d, fused (%s)", done + 1, done + len(pack), len(runs), nums)
            started = time.monotonic()
            pack_returns = run_pack(self, pack)
            progress.add([status(ret) for ret in pack_returns], time.monotonic() - started)
            for (_, num), ret in zip(pack, pack_returns):
                returns[num] = ret
            if interrupted():  # the run's job caught what Ctrl-C became (Hydra's run_job: any Exception)
                raise KeyboardInterrupt
            log.info("%s", progress.line(done + 1, done + len(pack)))
            done += len(pack)
        return returns


def skipped_return(overrides: Sequence[str], run: Any) -> JobReturn:
    """The return of a run that gets no job because it was done when the sweep started (`skipped`), its folder held a
    damaged record then (`damaged`), or, on SLURM, another process had it (`running`: not submitted); its log folder's
    outcome.json says so, as its job's would (peltbench.missing.SweepSummary counts them from there). `run`: its
    peltbench.missing.Run."""
    from peltbench.missing import RUNNING_ELSEWHERE

    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = "skipped" if run.state == "done" else run.state
    if run.log_dir is not None:
        write_outcome(run.log_dir, ret.return_value,
                      RUNNING_ELSEWHERE if run.state == "running" else run.error if run.state == "damaged" else None)
    return ret


def plan_packs(config_loader: Any, sweep_config: DictConfig, runs: List[Run]) -> Tuple[List[List[Run]], List[List[Run]]]:
    """The runs grouped as they will train (group_packs), their configs composed here."""
    return group_packs(runs, compose_jobs(config_loader, sweep_config, [overrides for overrides, _ in runs]))


def group_packs(runs: List[Run], cfgs: List[DictConfig]) -> Tuple[List[List[Run]], List[List[Run]]]:
    """The runs grouped as they will train: fused groups (fuse=true) and runs of their own, in sweep order;
    and the packs of the fine-tuning runs that could not fuse although fuse=true. `cfgs`: each run's config."""
    groups = plan_groups(cfgs)
    packs = [[runs[i] for i in group] for group in groups]
    alone = [pack for pack, group in zip(packs, groups)
             if cfgs[group[0]].get("fuse", False) and "full" in cfgs[group[0]].method.components]
    return packs, alone


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
