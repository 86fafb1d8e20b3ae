"""A sweep on several devices, `hydra.launcher.devices=[cuda:0,cuda:1,...]` (or `all`, or `[cpu,cpu]`): the plan made
once, as for one device (composed, checked, grouped: _launcher.plan_sweep), and its groups handed to one worker process
per device (_worker.py) as the workers free up, the longest first (peltbench.workers.hand_out_order, by
config.planned_work: token positions through the encoder). Each worker trains a group as the one-device launcher
does (run_pack), so each run's record is the one a one-device sweep writes.

This process trains nothing: it hands out the groups, logs one progress line per finished group (the runs done of
all, an ETA from the groups finished, each device's group), and collects the runs' returns for the sweep's summary.

Faults: a worker that dies (kill -9, a crash of the process, the kernel's OOM killer) loses only the runs of its group:
they are returned `lost`, with the device and the worker's log as the reason their summary line gives (their claims die
with it and the next process to claim them takes them over, peltbench.claim), its device takes no more groups, and the
other devices go on with the rest. Ctrl-C or SIGTERM (or, on SLURM, the job's signals) reaches this process, which
relays it to every worker (_worker.RELAY): each stops at the end of its training step with its checkpoint written, and
the command then ends with one line as a one-device sweep does; a second Ctrl-C stops them at once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, List, Sequence, Tuple

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import open_dict

from peltbench.checkpoint import mark_progress
from peltbench.workers import hand_out_order, worker_environment

from ._progress import SweepProgress, status
from ._worker import RELAY, launcher_payload, work

log = logging.getLogger(__name__)

Run = Tuple[List[str], int]  # one run of the sweep: its overrides and its job number
POLL_S = 1.0


@dataclass
class Worker:
    name: str                     # its device, numbered where two workers share one (`cpu-0`, `cpu-1`)
    device: str
    process: Any
    connection: Any
    log_path: Path
    pack: int | None = None       # the index of the pack it trains now
    started: float = 0.0
    gone: bool = False            # its end of the pipe is closed: it has exited, or is about to


class DevicePool:
    """One sweep's (or SLURM array task's) workers, one per device: `run(packs)` trains the packs on them and returns
    every run's JobReturn."""

    def __init__(self, launcher: Any, devices: Sequence[str], job_id: Any = None) -> None:
        self.launcher, self.devices, self.job_id = launcher, list(devices), job_id
        self.sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
        self.failed: dict[str, str] = {}  # worker name -> how it died
        self.workers: List[Worker] = []
        self.packs: List[List[Run]] = []
        self.order: deque = deque()
        self.alone: Sequence[int] = ()
        self.returns: dict[int, JobReturn] = {}
        self.progress: SweepProgress | None = None
        self.stopping = 0  # how many times a stop was relayed: once stopped, a run() that returns left runs untrained

    def run(self, packs: List[List[Run]], work: Sequence[float | None], progress: SweepProgress,
            alone: Sequence[int] = ()) -> dict:
        """Train `packs` (each a fused group or a run of its own; `work`: each one's planned work) on the workers,
        longest first; one JobReturn per run. `alone`: the packs of fine-tuning runs that cannot fuse (said so).

        A stop signal waits here as it waits for a training step's end in a one-device sweep (peltbench.interrupts:
        this process is inside `step_boundaries` while its workers train): it is relayed to every worker, which stops
        at its step's end with its checkpoint written, and once all have stopped it does what it asks (Ctrl-C,
        SIGTERM: the command stops; on SLURM, USR2 requeues the job). A second one stops the workers at once."""
        from peltbench.interrupts import step_boundaries, stop_pending

        self.packs, self.alone, self.progress = packs, alone, progress
        self.order = deque(hand_out_order(work))
        try:
            with step_boundaries():  # leaving it, a stop that waited does what it asks (raises, for Ctrl-C)
                try:
                    self._start()
                    for worker in self.workers:
                        self._give(worker)
                except KeyboardInterrupt:  # a second stop: at once
                    self._relay()
                while self._live():
                    try:
                        if stop_pending() and not self.stopping:
                            self._relay()
                        self._collect()
                    except KeyboardInterrupt:
                        self._relay()
        finally:
            for worker in self.workers:
                self._end(worker)
        if self.stopping:  # stopped, and what stopped it went on (SLURM's SIGTERM: the job waits for its end)
            return self.returns
        for index in self.order:  # every device's worker died: nothing trains them
            self._lose(packs[index], "it was not trained: every device's worker died (" +
                       "; ".join(f"{device}: {how}" for device, how in self.failed.items()) + ")")
        return self.returns

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        payload = launcher_payload(self.launcher)
        for index, device in enumerate(self.devices):
            log_path = self.sweep_dir / ".workers" / f"{index}_{device.replace(':', '')}.log"  # no colon: any file system
            ours, theirs = context.Pipe()
            process = context.Process(target=work, name=f"peltbench-{device}", daemon=False,
                                      args=(device, worker_environment(device, self.devices), str(log_path), payload,
                                            theirs))
            process.start()
            theirs.close()
            name = f"{device}-{index}" if self.devices.count(device) > 1 else device
            self.workers.append(Worker(name, device, process, ours, log_path))
        log.info("%d workers: %s (their consoles: %s)", len(self.workers), ", ".join(self.devices),
                 self.sweep_dir / ".workers")

    def _live(self) -> List[Worker]:
        """The workers that may still answer."""
        return [worker for worker in self.workers if not worker.gone]

    def _give(self, worker: Worker) -> None:
        """Hand the worker its next pack (said in the log), or None (no more: it ends)."""
        self._assign(worker)
        self._hand_over(worker)

    def _assign(self, worker: Worker) -> None:
        """The worker's next pack: the longest left (none once stopping, or for a worker that died)."""
        worker.pack = None
        if self.order and not self.stopping and worker.name not in self.failed:
            worker.pack, worker.started = self.order.popleft(), time.monotonic()

    def _hand_over(self, worker: Worker) -> None:
        if worker.pack is None:
            self._send(worker, None)
            return
        pack = self.packs[worker.pack]
        if len(pack) == 1:
            log.info("%s: run #%d: %s", worker.name, pack[0][1], " ".join(filter_overrides(pack[0][0])))
            if worker.pack in self.alone:
                log.info("fine-tuning trains alone: it changes the backbone, which fused runs share")
        else:
            log.info("%s: runs %s, fused", worker.name, ", ".join(f"#{num}" for _, num in pack))
        self._send(worker, (worker.pack, pack, self.job_id))

    @staticmethod
    def _send(worker: Worker, message: Any) -> None:
        try:
            worker.connection.send(message)
        except OSError:  # it died: _collect finds out
            pass

    def _collect(self) -> None:
        """Wait for a worker to answer or die, and act on it."""
        waited = {}
        for worker in self._live():
            waited[worker.connection] = waited[worker.process.sentinel] = worker
        for worker in {id(waited[ready]): waited[ready] for ready in wait(list(waited), timeout=POLL_S)}.values():
            message = None
            try:
                if worker.connection.poll():
                    message = worker.connection.recv()
            except (EOFError, OSError):  # its end of the pipe is closed: it has exited, or is exiting
                worker.gone = True
            if message is not None:
                self._answer(worker, message)
            elif worker.gone or not worker.process.is_alive():
                # a worker killed closes its pipe a moment before its process has ended: wait for that end here (it
                # is never looked at again once gone), so that the runs of the group it held are lost, not forgotten
                worker.process.join(timeout=60)
                if worker.process.is_alive():  # its pipe closed, yet it lives on: it can tell nothing more
                    worker.process.kill()
                    worker.process.join()
                worker.gone = True
                if worker.pack is not None:
                    self._died(worker)

    def _answer(self, worker: Worker, message: tuple) -> None:
        what, index = message[0], message[1]
        if index != worker.pack:
            return
        if what == "started":
            worker.started = time.monotonic()
            return
        pack, seconds = self.packs[index], time.monotonic() - worker.started
        worker.pack = None
        if what == "stopped":
            if message[2]:
                mark_progress()
            return
        if what == "error":
            log.error("%s: runs %s could not start: %s (the worker's log: %s)", worker.name,
                      ", ".join(f"#{num}" for _, num in pack), message[2], worker.log_path)
            pack_returns = self._lose(pack, f"its group could not start on {worker.name}: {message[2]}")
        else:
            if message[3]:
                mark_progress()
            pack_returns = [_job_return(*values) for values in message[2]]
            self.returns.update({num: ret for (_, num), ret in zip(pack, pack_returns)})
        self._assign(worker)
        self._progress(pack, pack_returns, seconds)
        self._hand_over(worker)

    def _progress(self, pack: List[Run], pack_returns: List[JobReturn], seconds: float) -> None:
        """The sweep's line: runs done of all, the ETA (from the groups finished, over the devices training), and
        what each device trains now."""
        progress = self.progress
        done = progress.finished
        progress.add([status(ret) for ret in pack_returns], seconds)
        progress.parallel = max(1, min(len(self.workers) - len(self.failed),
                                       len(self.order) + sum(worker.pack is not None for worker in self.workers)))
        log.info("%s · %s", progress.line(done + 1, done + len(pack)), self._now())

    def _now(self) -> str:
        """`now: cuda:0 #9 (+3 fused), cuda:1 #13, cuda:2 idle`: what each device trains."""
        parts = []
        for worker in self.workers:
            if worker.name in self.failed:
                parts.append(f"{worker.name} failed")
            elif worker.pack is None:
                parts.append(f"{worker.name} idle")
            else:
                pack = self.packs[worker.pack]
                parts.append(f"{worker.name} #{pack[0][1]}" + (f" (+{len(pack) - 1} fused)" if len(pack) > 1 else ""))
        return "now: " + ", ".join(parts)

    def _died(self, worker: Worker) -> None:
        """The worker died in its pack: the pack's runs are lost (with why, for the summary), its device is done."""
        index, worker.pack = worker.pack, None
        if self.stopping:  # told to stop, it ended before it could say so (a signal before its handlers were set)
            return
        how = _how(worker.process.exitcode)
        self.failed[worker.name] = how
        pack = self.packs[index]
        log.error("%s: its worker died (%s) while training %s: not done (rerun the same command); %s takes no more "
                  "groups, the sweep goes on on the other devices (the worker's console: %s)", worker.name, how,
                  ", ".join(f"#{num}" for _, num in pack), worker.name, worker.log_path)
        self._progress(pack, self._lose(pack, f"the worker on {worker.name} died ({how}) while training it (the "
                                              f"worker's console: {worker.log_path})"), time.monotonic() - worker.started)

    def _lose(self, pack: List[Run], reason: str) -> List[JobReturn]:
        """`lost` returns for the pack's runs, the reason in each one's job folder (outcome.json) for the summary."""
        from peltbench.missing import write_outcome

        lost = []
        for overrides, num in pack:
            folder = self._job_folder(overrides, num)
            if folder is not None:
                write_outcome(folder, "lost", reason)
            ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
            ret.return_value = "lost"  # not FAILED: the sweep goes on; its summary reports the run as missing
            self.returns[num] = ret
            lost.append(ret)
        return lost

    def _job_folder(self, overrides: List[str], num: int) -> Path | None:
        """The run's Hydra job folder (hydra.sweep.dir / hydra.sweep.subdir), as its job makes it."""
        try:
            config = self.launcher.hydra_context.config_loader.load_sweep_config(self.launcher.config, list(overrides))
            with open_dict(config):
                config.hydra.job.num = num
                config.hydra.job.id = num if self.job_id is None else self.job_id
            return Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        except Exception:  # noqa: BLE001 - best effort: the summary then says only that its record is missing
            return None

    def _relay(self) -> None:
        """Tell every live worker to stop: at the end of its training step, after a checkpoint (a second time: now).
        No more groups are handed out."""
        self.stopping += 1
        for worker in self.workers:
            if worker.process.is_alive():
                try:
                    os.kill(worker.process.pid, RELAY)
                except ProcessLookupError:
                    pass

    @staticmethod
    def _end(worker: Worker) -> None:
        """The worker is told there is no more and waited for; one still training here (this process failed) is told
        to stop at its step's end first, so that it leaves a checkpoint and no claim."""
        if worker.pack is not None and worker.process.is_alive():
            try:
                os.kill(worker.process.pid, RELAY)
            except ProcessLookupError:
                pass
        DevicePool._send(worker, None)
        worker.process.join(timeout=120)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.connection.close()


def _job_return(overrides: List[str], completed: bool, value: str) -> JobReturn:
    ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED if completed else JobStatus.FAILED)
    if completed:
        ret.return_value = value
    else:
        ret.return_value = RuntimeError(value)
    return ret


def _how(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"

