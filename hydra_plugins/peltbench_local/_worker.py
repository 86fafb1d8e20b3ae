"""A worker of a sweep on several devices (_pool.py): one process per entry of `hydra.launcher.devices`, started with
multiprocessing's 'spawn' (CUDA cannot be forked), that trains the groups handed to it one at a time, each exactly as
the one-device launcher does: `run_pack`, so the same Hydra jobs, job folders, logs and callbacks, and inside them the
same runner.run_group, claims and checkpoints.

Before torch touches CUDA its environment is set (peltbench.workers.worker_environment: CUDA_VISIBLE_DEVICES names
its GPU alone, or none for `cpu`; OMP_NUM_THREADS its share of the cores), and its console output goes to its own
file, `<sweep dir>/.workers/<device>.log` (a crash's trace lands there; each group's log is in its job folder).

Signals: the sweep's process relays a stop (Ctrl-C, SIGTERM, SLURM's USR2) to each worker as SIGUSR1, which stops it as
Ctrl-C stops the command (peltbench.interrupts: at the end of the training step, after a checkpoint; a second relay,
at once). SIGTERM sent to the worker itself (`kill`, SLURM's scancel, which signals every process of the job) does the
same: told both ways, it still stops at the step's end, once. SIGINT is ignored (a terminal's Ctrl-C reaches every
process of the command, and the sweep's process relays it once), and so is USR2 (SLURM's, relayed too). A worker whose
sweep process died stops as if told to.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

RELAY = signal.SIGUSR1  # the sweep's process to its workers: stop at the end of the step (a second time: at once)


def work(device: str, environment: dict, log_path: str, payload: bytes, connection: Any) -> None:
    """The worker's life: set up its device, then train each group the connection hands it (a message
    `(pack id, pack, job id)`; None: no more) and answer `(what, pack id, ...)`: `started`, then `done` with the runs'
    returns, `stopped` (a stop signal: the pack's runs stopped at a step's end) or `error`."""
    os.environ.update(environment)  # before torch is imported: its CUDA sees only this worker's GPU
    _console_to(log_path)
    from peltbench.interrupts import stop_on

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    stop_on(signal.SIGTERM, RELAY)
    _stop_when_orphaned()
    threads = environment.get("OMP_NUM_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    try:
        launcher = _launcher(payload)
        _serve(launcher, connection)
    except KeyboardInterrupt:  # stopped between groups, or while starting
        pass
    finally:
        connection.close()


def _serve(launcher: Any, connection: Any) -> None:
    import traceback

    from peltbench.checkpoint import progressed
    from peltbench.interrupts import interrupted

    from ._launcher import run_pack

    while True:
        message = connection.recv()
        if message is None:
            return
        pack_id, pack, job_id = message
        connection.send(("started", pack_id))  # its time counts from here (the ETA), not from the worker's start
        try:
            returns = run_pack(launcher, pack, job_id)
        except KeyboardInterrupt:
            connection.send(("stopped", pack_id, progressed()))
            return
        except Exception as error:  # noqa: BLE001 - outside the runs' jobs (a config that would not compose): said once
            traceback.print_exc()
            connection.send(("error", pack_id, (str(error).strip().splitlines() or [type(error).__name__])[0]))
            continue
        if interrupted():  # a run's job caught what the stop became (Hydra's run_job: any Exception)
            connection.send(("stopped", pack_id, progressed()))
            return
        connection.send(("done", pack_id, [returned(ret) for ret in returns], progressed()))


def returned(ret: Any) -> tuple:
    """A run's JobReturn as plain data for the sweep's process: its overrides, whether it completed, and what its job
    returned (peltbench.runner.sweep_status) or the first line of what it raised."""
    from hydra.core.utils import JobStatus

    if ret.status == JobStatus.COMPLETED:
        return list(ret.overrides), True, str(ret._return_value)
    error = ret._return_value
    return list(ret.overrides), False, (str(error).strip().splitlines() or [type(error).__name__])[0]


def _console_to(log_path: str) -> None:
    """The worker's stdout and stderr (Hydra's console handler, libraries' warnings, a crash's trace) to its own file:
    the sweep's screen shows the sweep's lines only."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    target = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)


def _stop_when_orphaned() -> None:
    """If the sweep's process dies (kill -9), stop as if it had relayed a stop: the group in training writes its
    checkpoint at the end of its step and releases its claims, so the same command goes on from there."""
    import multiprocessing
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os.kill(os.getpid(), RELAY)
    threading.Thread(target=watch, name="peltbench-orphan", daemon=True).start()


def launcher_payload(launcher: Any) -> bytes:
    """What a worker needs of the sweep's launcher to run its jobs as it does (run_pack): the sweep's config, Hydra's
    context (its config loader, the callbacks) and state, and the task function (by name where it cannot be pickled:
    `peltbench`'s is decorated by hydra.main), pickled once for every worker."""
    import pickle

    from hydra.core.singleton import Singleton

    task = launcher.task_function
    try:
        task = pickle.dumps(task)
    except (pickle.PicklingError, AttributeError, TypeError):
        task = (task.__module__, task.__qualname__)
    instances = Singleton.get_state()["instances"]  # Hydra's resolvers are lambdas: the worker registers its own
    return pickle.dumps((launcher.config, launcher.hydra_context, task, instances))


class _Launcher:
    """What run_pack reads of a launcher."""

    def __init__(self, config: Any, hydra_context: Any, task_function: Any) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function


def _launcher(payload: bytes) -> _Launcher:
    import importlib
    import inspect
    import pickle

    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals

    from peltbench.launchers import register_launchers

    config, hydra_context, task, instances = pickle.loads(payload)
    Singleton._instances = instances  # as Singleton.set_state, less the resolvers
    Plugins.instance()
    register_launchers()
    setup_globals()
    if isinstance(task, bytes):
        task = pickle.loads(task)
    else:
        module, name = task
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
        task = inspect.unwrap(found)  # hydra.main's wrapper around the task function
    return _Launcher(config, hydra_context, task)
