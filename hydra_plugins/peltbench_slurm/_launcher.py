"""`hydra/launcher=peltbench_slurm`: hydra-submitit-launcher's SLURM launcher, with several runs packed into one job.

A few-shot run (K = 100) leaves a GPU idle most of the time, so `runs_per_job: N` runs N of a sweep's runs one
after another in one array task: one process, one model load (peltbench.model caches it), one CUDA context.
`runs_per_job: 1` (the default) is one run per array task, like `submitit_slurm`. With `fuse=true` each fused
group of compatible runs (peltbench.fusion, at most `fuse_members`) is one array task that trains them together.
`gpus_per_node: G` > 1 gives each task G GPUs and G times the pieces (G fused groups, or G × runs_per_job runs, taken
longest first), trained one per GPU at once by the local launcher's workers (peltbench_local's _pool.py).

Before submitting, the request (cpus_per_task, mem_gb, gpus_per_node, timeout_min) is checked against the partition;
while waiting, the jobs' pending reasons are logged, and a reason that can never clear stops the sweep (_request.py).

Resume: runs whose records are already done are not submitted, nor runs that another live process is training
(claimed: peltbench.claim), and each submitted run skips itself if its record is done by then (peltbench.runner).
Groups are planned on the whole sweep, done runs included, then those are left out: a sweep run again forms the
groups it formed before, so their checkpoints resume them. On SLURM's pre-timeout or preemption signal (USR2), the
job's training writes a checkpoint at the end of its step (peltbench.checkpoint), then submitit calls `checkpoint()`
(SlurmLauncher's), which requeues the same pack: its finished runs skip, the interrupted one goes on from its
checkpoint. SIGTERM (preemption, scancel, the time limit without USR2) writes a checkpoint at the end of the step
too, and lets SLURM end the job. `max_num_timeout` counts the time-limit requeues in a row that made no progress: a
job that trained (a checkpoint further on than where it started, or a run finished) requeues with the count back at
max_num_timeout, so a group longer than timeout_min finishes across as many requeues as it takes, and one that cannot
train a step within timeout_min stops after max_num_timeout of them (`_count_progress`).
A pack that ends without results (scancel, node failure) is logged and its runs returned as `lost`, so the
sweep's other jobs and batches go on; rerunning the sweep runs what it lacks, from its checkpoints.
"""

from __future__ import annotations

import getpass
import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, setup_globals
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf, open_dict

from peltbench.progress import duration

from ._request import check_request, never_starts

log = logging.getLogger(__name__)

Run = Tuple[List[str], int]  # one run of the sweep: its overrides and its job number


@dataclass
class PeltbenchSlurmConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.peltbench_slurm._launcher.PeltbenchSlurmLauncher"
    # Runs per SLURM array task, run one after another in one process (one model load, one CUDA context).
    runs_per_job: int = 1


ConfigStore.instance().store(group="hydra/launcher", name="peltbench_slurm", node=PeltbenchSlurmConf,
                             provider="peltbench")


class PeltbenchSlurmLauncher(SlurmLauncher):
    def __init__(self, runs_per_job: int = 1, **params: Any) -> None:
        if runs_per_job < 1:
            raise ValueError(f"hydra.launcher.runs_per_job={runs_per_job}: must be a positive integer")
        self.runs_per_job = runs_per_job
        super().__init__(**params)

    def __call__(self, pack: List[List[Run]], job_dir_key: str, singleton_state: Dict[type, Singleton]) -> List[JobReturn]:
        """In the array task: the pack's pieces one after another, each a run of its own or a fused group (fuse=true),
        as the local launcher runs them (peltbench_local.run_pack). A run that fails is recorded FAILED in its
        JobReturn by run_job and the next one starts."""
        import submitit
        from hydra_plugins.peltbench_local import run_pack

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        environment = submitit.JobEnvironment()
        checkpoint_on_signals(environment._usr_sig(), int(self.params["max_num_timeout"]))
        if int(self.params.get("gpus_per_node") or 0) > 1:
            return self._on_gpus(pack, environment.job_id)
        return [ret for piece in pack for ret in run_pack(self, piece, environment.job_id)]

    def _on_gpus(self, pack: List[List[Run]], job_id: Any) -> List[JobReturn]:
        """An array task given several GPUs (gpus_per_node > 1): its pieces on one worker per GPU it sees, as a local
        sweep's `hydra.launcher.devices=all` (peltbench_local's _pool.py), in the order packed (longest first). Its
        signals wait for the workers' checkpoints (checkpoint_on_signals, then the pool's relay): USR2 then requeues the
        job, SIGTERM leaves it to SLURM to end."""
        from hydra_plugins.peltbench_local._pool import DevicePool
        from hydra_plugins.peltbench_local._progress import SweepProgress
        from peltbench.workers import sweep_devices

        runs = [run for piece in pack for run in piece]
        pool = DevicePool(self, sweep_devices("all"), job_id)
        returns = pool.run(pack, [None] * len(pack), SweepProgress(len(runs), len(runs)))
        while pool.stopping:  # SIGTERM: the workers' checkpoints are written; SLURM ends the job (as one-GPU jobs wait)
            time.sleep(60)
        return [returns[num] for _, num in runs]

    # checkpoint() is SlurmLauncher's: a DelayedSubmission of this object with the same pack, which submitit
    # pickles and requeues on the pre-timeout / preemption signal (max_num_timeout: checkpoint_on_signals).

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit one array task per pack of `runs_per_job` runs not yet done; wait; one JobReturn per run, in order.

        Runs whose records are already done are not submitted at all: a resumed sweep queues only what it lacks;
        nor are runs another live process is training (their claims).
        """
        from hydra_plugins.peltbench_local._launcher import skipped_return
        from peltbench.missing import note_no_job

        assert self.config is not None and len(job_overrides) > 0
        runs = [(list(overrides), initial_job_idx + i) for i, overrides in enumerate(job_overrides)]
        states = self._states(job_overrides, initial_job_idx)
        returns = {num: skipped_return(overrides, states[num].state) for overrides, num in runs
                   if states[num].state in ("done", "running", "damaged")}
        for num in returns:  # no job, no log folder: the sweep's summary takes them from here
            note_no_job(str(self.config.hydra.sweep.dir), states[num])
        todo = [run for run in runs if run[1] not in returns]
        packs = self._packs(runs, set(returns))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info("Submitit 'slurm' sweep output dir : %s", sweep_dir)
        running = sum(states[num].state == "running" for _, num in runs)
        damaged = sum(states[num].state == "damaged" for _, num in runs)
        fused = sum(len(piece) for pack in packs for piece in pack if len(piece) > 1)
        gpus = max(1, int(self.params.get("gpus_per_node") or 1))
        grouped = "one group per task" if gpus == 1 else f"{gpus} groups per task, one per GPU"
        each = f"up to {self.runs_per_job} runs each" if gpus == 1 else \
            f"up to {self.runs_per_job * gpus} runs each, {gpus} at once (one per GPU)"
        log.info("%d runs: %d already done (not submitted), %d to run in %d array tasks (%s)", len(runs),
                 len(returns) - running - damaged, len(todo), len(packs),
                 f"{fused} of them in fused groups, {grouped}" if fused else each)
        if running:
            log.info("%d runs are being trained by other processes (claimed; not submitted)", running)
        if damaged:
            log.warning("%d runs' folders hold a damaged record (not submitted; the summary names them)", damaged)
        for overrides, job_num in todo:
            log.info("\t#%d : %s", job_num, " ".join(filter_overrides(overrides)))
        if packs:
            _stop_if(check_request(self.params))
            self._warn_if_still_queued()
            state = Singleton.get_state()
            jobs = self._executor().map_array(self, packs, ["hydra.sweep.dir"] * len(packs), [state] * len(packs))
            try:
                finished = wait(jobs, [sum(len(piece) for piece in pack) for pack in packs])
            except NeverStarts as error:
                subprocess.run(["scancel", *[job.job_id for job in jobs]], capture_output=True, timeout=60)
                _stop_if(f"{error}; cancelled this sweep's {len(jobs)} array tasks")
            for job, pack, done in zip(jobs, packs, finished):
                flat = [run for piece in pack for run in piece]
                for (_, num), ret in zip(flat, self._results(job, flat, done, states)):
                    returns[num] = ret
        return [returns[num] for _, num in runs]

    def _packs(self, runs: List[Run], skipped: Set[int]) -> List[List[List[Run]]]:
        """The array tasks: each a list of pieces (a run of its own, or a fused group of compatible runs, fuse=true).

        Groups are planned on all of the sweep's runs, then the `skipped` ones (done, or another process's) leave
        them: a sweep run again forms the groups it formed before (as the local launcher does), so that their
        checkpoints resume them. A fused group is one array task (its size is capped by fuse_members); other runs
        are packed `runs_per_job` to a task. A task given G GPUs (gpus_per_node=G > 1) trains G pieces at once, one per
        GPU: it gets G fused groups, or G × runs_per_job runs, taken longest first over the sweep (config.planned_work),
        so that a task's pieces are alike in length."""
        from hydra_plugins.peltbench_local._launcher import group_packs
        from peltbench.config import planned_work
        from peltbench.missing import compose_jobs
        from peltbench.workers import hand_out_order

        assert self.hydra_context is not None and self.config is not None
        cfgs = compose_jobs(self.hydra_context.config_loader, self.config, [overrides for overrides, _ in runs])
        planned, _ = group_packs(runs, cfgs)
        pieces = [left for piece in planned if (left := [run for run in piece if run[1] not in skipped])]
        gpus = max(1, int(self.params.get("gpus_per_node") or 1))
        if gpus > 1:
            work = {num: planned_work(cfg) for (_, num), cfg in zip(runs, cfgs)}
            lengths = [None if any(work[num] is None for _, num in piece) else sum(work[num] for _, num in piece)
                       for piece in pieces]
            pieces = [pieces[index] for index in hand_out_order(lengths)]
        return task_packs(pieces, self.runs_per_job, gpus)

    def _states(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Dict[int, Any]:
        """Each job number's run and the state of its record (peltbench.missing composes and checks them)."""
        from peltbench.missing import check_jobs

        assert self.hydra_context is not None and self.config is not None
        runs = check_jobs(self.hydra_context.config_loader, self.config, job_overrides, first_num=initial_job_idx)
        return {run.num: run for run in runs}

    def _warn_if_still_queued(self) -> None:
        """An earlier sweep killed on the submitting side leaves its jobs running; their unfinished runs would run twice."""
        name = str(self.params.get("name"))
        queued = _queued(f"--name={name}")
        if queued:
            log.warning("%d SLURM jobs named %s are still queued or running (an earlier sweep?): a run that both "
                        "reach is trained by the first to claim it, and skipped by the other. `squeue --name=%s` "
                        "lists them, `scancel --name=%s` stops them.", len(queued), name, name, name)

    def _executor(self) -> Any:
        """The submitit executor, configured from the launcher's keys exactly as BaseSubmititLauncher.launch does."""
        import submitit

        init_keys = {"submitit_folder", "max_num_timeout"}
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=self.params["submitit_folder"],
                                         slurm_max_num_timeout=self.params["max_num_timeout"])
        base_keys = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{key if key in base_keys else f"{self._EXECUTOR}_{key}": value
                                      for key, value in self.params.items() if key not in init_keys})
        return executor

    @staticmethod
    def _results(job: Any, pack: List[Run], finished: bool, states: Dict[int, Any]) -> List[JobReturn]:
        """The pack's JobReturns; for a pack whose job ended without results, a `lost` return per run, and the
        reason in each run's log folder for the sweep's summary."""
        from peltbench.missing import write_outcome

        if finished:
            try:
                return job.results()[0]
            except Exception as error:  # e.g. "timed-out too many times": submitit re-raises it here
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        else:
            reason = f"it left the queue without results (cancelled, node failure, out of memory?); see {job.paths.stderr}"
        log.error("SLURM job %s (runs #%s) ended without results: %s", job.job_id,
                  ",".join(str(num) for _, num in pack), reason)
        lost = []
        for overrides, num in pack:
            write_outcome(states[num].log_dir, "lost", f"SLURM job {job.job_id} ended without results: {reason}")
            ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
            ret.return_value = "lost"  # not FAILED: the sweep goes on; its summary reports the run as missing
            lost.append(ret)
        return lost


def task_packs(pieces: List[List[Run]], runs_per_job: int, gpus: int = 1) -> List[List[List[Run]]]:
    """The array tasks' pieces: `gpus` fused groups per task (one per GPU), then the runs of their own,
    `runs_per_job` × `gpus` per task, each list in the order given."""
    fused = [piece for piece in pieces if len(piece) > 1]
    single = [piece for piece in pieces if len(piece) == 1]
    per_task = runs_per_job * gpus
    return [fused[i:i + gpus] for i in range(0, len(fused), gpus)] + \
        [single[i:i + per_task] for i in range(0, len(single), per_task)]


def checkpoint_on_signals(usr_signal: int, max_num_timeout: int) -> None:
    """In the job: SLURM's USR2 (`usr_signal`: signal_delay_s before the time limit, or at preemption) and SIGTERM
    wait for the training loop's step to end, where a checkpoint is written (peltbench.interrupts); then USR2 does what
    submitit's handler does (calls checkpoint(), requeues the job, exits), counting progress (`_count_progress`), and
    SIGTERM what submitit does with it (nothing: SLURM ends or requeues the job). Outside training, at once."""
    import signal

    from peltbench.interrupts import at_step_boundary

    requeue, bypass = signal.getsignal(usr_signal), signal.getsignal(signal.SIGTERM)

    def then_requeue(signum: int) -> None:
        _count_progress(requeue, max_num_timeout)
        requeue(signum, None)

    def then_go_on(signum: int) -> None:
        if callable(bypass):
            bypass(signum, None)
    if callable(requeue):
        at_step_boundary(usr_signal, then_requeue, "the job requeues")
    at_step_boundary(signal.SIGTERM, then_go_on, "training goes on until SLURM ends the job")


def _count_progress(handler: Any, max_num_timeout: int) -> None:
    """The rule: max_num_timeout bounds the time-limit requeues in a row without progress. submitit counts every one
    (its countdown, which it lowers by one at each time-limit requeue); a job that trained since it started (a
    checkpoint further on than where it began, or a run finished: peltbench.checkpoint.progressed) puts it back at
    max_num_timeout before submitit lowers it."""
    from peltbench.checkpoint import progressed

    owner = getattr(handler, "__self__", None)
    delayed = getattr(owner, "_delayed", None)
    if delayed is None or not progressed():
        return
    timed_out = bool(owner.has_timed_out())
    delayed._timeout_countdown = max_num_timeout + (1 if timed_out else 0)
    log.info("this job trained since it started: its requeue does not count against max_num_timeout=%d",
             max_num_timeout)


class NeverStarts(Exception):
    """A job's pending reason says it can never start."""


def wait(jobs: List[Any], sizes: Optional[List[int]] = None, poll_s: float = 1.0) -> List[bool]:
    """Wait until every job has written its result or has left SLURM's queue without one; True for the first.

    submitit's own wait asks `sacct` whether a job without results has ended; on a cluster without accounting
    storage sacct cannot answer, and a cancelled job would be waited for forever. squeue always answers: a job
    missing from two successive listings (and without results) has ended. A requeued job stays listed (pending).
    squeue is asked every 2 s at first, then less often (a tenth of the time waited so far, at most every minute).
    Why jobs are pending is logged when it changes; a reason that can never clear raises NeverStarts. Each time more
    jobs have finished, a line says how many of their runs (`sizes`: runs per job) are done, with an ETA.
    """
    finished = [False] * len(jobs)
    progress = ArrayProgress(sizes or [1] * len(jobs))
    absent: Dict[int, int] = {}  # job index -> successive listings without it
    pending = ""
    started = listed_at = time.monotonic()
    while True:
        for i, job in enumerate(jobs):
            finished[i] = finished[i] or job.paths.result_pickle.exists()
        progress.update(finished)
        waiting = [i for i, done in enumerate(finished) if not done]
        if all(absent.get(i, 0) >= 2 for i in waiting):
            return finished
        now = time.monotonic()
        if now - listed_at >= min(60.0, max(2.0, (now - started) / 10)):
            listed_at = now
            queued = _queued()
            for i in waiting if queued is not None else []:
                absent[i] = 0 if jobs[i].job_id in queued else absent.get(i, 0) + 1
            reasons = {queued[jobs[i].job_id] for i in waiting if queued and queued.get(jobs[i].job_id)}
            never = sorted(reason for reason in reasons if never_starts(reason))
            if never:
                raise NeverStarts(f"SLURM will never start this sweep's jobs: they are pending with reason {never[0]} "
                                  f"(the request breaks a limit of the partition, QOS or account)")
            summary = ", ".join(sorted(reasons))
            if summary != pending:
                pending = summary
                if summary:
                    log.info("SLURM jobs pending: %s", summary)
        time.sleep(poll_s)


class ArrayProgress:
    """`runs: 8 of 24 done (3 of 9 array tasks) · 4m10s elapsed · ETA 9m`, logged when more array tasks have
    finished. Tasks run side by side, so the ETA is the time per finished task so far times the tasks left: a rough
    guide while the queue is busy."""

    def __init__(self, sizes: List[int]) -> None:
        self.sizes, self.started, self.shown = sizes, time.monotonic(), 0

    def update(self, finished: List[bool]) -> None:
        tasks = sum(finished)
        if tasks == self.shown:
            return
        self.shown = tasks
        runs = sum(size for size, done in zip(self.sizes, finished) if done)
        elapsed = time.monotonic() - self.started
        line = (f"runs: {runs} of {sum(self.sizes)} done ({tasks} of {len(self.sizes)} array tasks) · "
                f"{duration(elapsed)} elapsed")
        if tasks < len(self.sizes):
            line += f" · ETA {duration(elapsed / tasks * (len(self.sizes) - tasks), coarse=True)}"
        log.info("%s", line)


def _queued(*options: str) -> Optional[Dict[str, str]]:
    """This user's jobs in SLURM's queue (array tasks one by one, e.g. 123_4) -> why pending ("" once running);
    None if squeue fails."""
    try:
        listing = subprocess.run(["squeue", "--noheader", "--array", "--format=%i|%T|%r",
                                  f"--user={getpass.getuser()}", *options], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if listing.returncode != 0:
        return None
    jobs = [line.split("|", 2) for line in listing.stdout.splitlines() if line.count("|") >= 2]
    return {job: reason if state == "PENDING" and reason != "None" else "" for job, state, reason in jobs}


def _stop_if(problem: Optional[str]) -> None:
    """A request that can never run is a bad input: one line, exit status 2 (as peltbench's own input errors)."""
    if problem:
        print(f"peltbench: error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
