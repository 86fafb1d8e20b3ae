"""Ctrl-C and SIGTERM: the `peltbench` command stops with one line and exit status 130 (Ctrl-C) or 143 (SIGTERM, what
`kill`, SLURM's `scancel` and a job's time limit send), releasing its claims, never a failed record (peltbench.cli).

Python raises KeyboardInterrupt wherever the main thread is when SIGINT comes. Inside a library that cleans up in a
`finally` (OmegaConf restoring a node's flags), the cleanup can fail and raise another exception in its place
(`AttributeError: 'NoneType' object has no attribute '_invalidate_flags_cache'`), which the runner would write as
a `failed` record and the sweep would go past. So the command's handler also remembers that Ctrl-C came, and the
runner and the launcher treat any exception after it as the interruption it is (`interrupted()`).
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Callable, Iterator

_received = False
_signal = signal.SIGINT  # the last stop signal received: what the command's line and exit status say


def catch_ctrl_c() -> None:
    """Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt, as Python's own handler does for SIGINT, and are
    remembered: so SIGTERM ends the command as Ctrl-C does, its `finally` blocks run (claims released), instead of
    killing it where it stands. Each is left alone when it is ignored (SIGINT in a background job of a shell script)
    or handled by someone else."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _handler)


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
    raise KeyboardInterrupt


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
