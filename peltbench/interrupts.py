"""Ctrl-C and SIGTERM: the `peltbench` command stops with one line and exit status 130 (Ctrl-C) or 143 (SIGTERM, what
`kill`, SLURM's `scancel` and a job's time limit send), releasing its claims, never a failed record (peltbench.cli).

While a group trains, the stop waits for the next training step to end: there the training loop writes a checkpoint
(peltbench.checkpoint) and then stops, so the same command goes on from that step. A second Ctrl-C stops at once.
A SLURM job's signals (peltbench_slurm) take the same path with their own follow-up: USR2, SLURM's pre-timeout or
preemption signal, requeues the job after the checkpoint; SIGTERM there writes one and lets SLURM end the job.
Outside training (loading data, building the model) a signal acts at once.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT comes. Inside a library that cleans up in a
`finally` (OmegaConf restoring a node's flags), the cleanup can fail and raise another exception in its place
(`AttributeError: 'NoneType' object has no attribute '_invalidate_flags_cache'`), which the runner would write as
a `failed` record and the sweep would go past. So the command's handler also remembers that Ctrl-C came, and the
runner and the launcher treat any exception after it as the interruption it is (`interrupted()`).
"""

from __future__ import annotations

import logging
import signal
from contextlib import contextmanager
from typing import Callable, Iterator

log = logging.getLogger("peltbench")

_received = False
_signal = signal.SIGINT  # the last stop signal received: what the command's line and exit status say
_deferring = 0           # > 0 while a training loop stops at its next step boundary (`step_boundaries`)
_pending: tuple[int, Callable[[int], None]] | None = None  # a signal waiting there, and what it asks for then
STOPS = "the command stops"


def catch_ctrl_c() -> None:
    """Ctrl-C (SIGINT) and SIGTERM stop the command, as Python's own handler does for SIGINT, and are remembered: so
    SIGTERM ends the command as Ctrl-C does, its `finally` blocks run (claims released), instead of killing it where
    it stands. During training they wait for the end of the step (a checkpoint is written there). Each is left
    alone when it is ignored (SIGINT in a background job of a shell script) or handled by someone else."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _handler)


def stop_on(*signums: int) -> None:
    """These signals stop the process as Ctrl-C does (at the end of the training step, after a checkpoint): a worker of
    a sweep on several devices, told to stop by its sweep's process (hydra_plugins/peltbench_local/_worker.py)."""
    for signum in signums:
        signal.signal(signum, _handler)


def interrupted() -> bool:
    """Whether Ctrl-C (or SIGTERM) came: an exception raised since is the interruption, not a failure."""
    return _received


def stopped_by() -> str:
    """How the command was stopped, the first word of its last line: `interrupted` (Ctrl-C) or `terminated (SIGTERM)`."""
    return "terminated (SIGTERM)" if _signal == signal.SIGTERM else "interrupted"


def exit_status() -> int:
    """The conventional status of a command a signal stopped: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + int(_signal)


def _handler(signum, frame) -> None:
    global _received, _signal
    _received, _signal = True, signum
    if not _defer(signum, _stop_command, STOPS):
        raise KeyboardInterrupt


def _stop_command(signum: int) -> None:
    raise KeyboardInterrupt


def at_step_boundary(signum: int, then: Callable[[int], None], after: str) -> None:
    """Handle `signum` at the training loop's next step boundary, after a checkpoint: `then(signum)` runs there (it
    may raise or exit; if it returns, training goes on); `after` says what it does, for the log. Outside training
    `then` runs at once. For a SLURM job's USR2 and SIGTERM (peltbench_slurm)."""
    def handler(signum, frame) -> None:
        if not _defer(signum, then, after):
            then(signum)
    signal.signal(signum, handler)


def _defer(signum: int, then: Callable[[int], None], after: str) -> bool:
    """Leave the signal to the next step boundary, if a training loop is running and the same signal is not already
    waiting there (Ctrl-C twice: at once). Another signal replaces what the waiting one asks for."""
    global _pending
    if not _deferring or (_pending is not None and _pending[0] == signum):
        return False
    again = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
    log.warning("%s: a checkpoint at the end of this training step, then %s%s", _name(signum), after, again)
    _pending = (signum, then)
    return True


def _name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


@contextmanager
def step_boundaries() -> Iterator[None]:
    """A training loop runs within: stop signals wait for its next step boundary (`stop_pending`, `stop`)."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending is not None:  # the loop ended before its next step boundary: act now
            _, then = _pending
            signum, _pending = _pending[0], None
            then(signum)


def stop_pending() -> bool:
    """Whether a stop signal waits for this step boundary (write a checkpoint, then `stop()`)."""
    return _pending is not None


def stop() -> None:
    """What the waiting signal asks for, now that the checkpoint is written: stop (KeyboardInterrupt), requeue, or
    go on (its follow-up returns)."""
    global _pending
    if _pending is not None:
        (signum, then), _pending = _pending, None
        then(signum)


@contextmanager
def interruption(line: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C within: KeyboardInterrupt(line()), whether it came as KeyboardInterrupt or as the exception raised in its
    place; `line` says how far the command got (peltbench.missing.interrupted_line)."""
    try:
        yield
    except Exception:
        if not _received:
            raise
        raise KeyboardInterrupt(line()) from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(line()) from None
