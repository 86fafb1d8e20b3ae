"""Ctrl-C: the `peltbench` command stops with one line and exit status 130 (peltbench.cli), never a failed record.

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


def catch_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt, as Python's own handler does, and is remembered. Left alone when SIGINT is
    ignored (a background job of a shell script) or handled by someone else."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)


def interrupted() -> bool:
    """Whether Ctrl-C came: an exception raised since is the interruption, not a failure."""
    return _received


def _handler(signum, frame) -> None:
    global _received
    _received = True
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
