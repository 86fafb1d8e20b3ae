"""Progress of long loops (epochs, training steps, evaluation batches, tokenisation), in one place.

    for batch in progress(batches, "dev", unit="batch"): ...
    bar = progress(total=50, desc="epoch", unit="epoch", lines=False, outermost=True); bar.update(); bar.close()

- stderr is a terminal: a tqdm bar per loop (count, rate, elapsed, ETA); the console's log lines are printed above
  the bars instead of through them.
- otherwise (a log file, a pipe, SLURM): no bars. Once nothing has been logged for LOG_EVERY_S seconds, the loop
  running then logs one line naming the loops it is inside:
  `epoch 3/50 · train 40/120 steps · 1.2 steps/s · ETA 1m05s`.
- TQDM_DISABLE=1: neither (as tqdm itself).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator

log = logging.getLogger("peltbench")

LOG_EVERY_S = 10.0  # the longest silence in a log, give or take one step

_open: list[Progress] = []  # the loops running now, outermost first


class _LastLine(logging.Filter):
    """Notes when the `peltbench` logger last wrote a line (an epoch's line counts as progress too)."""

    at = time.monotonic()

    def filter(self, record: logging.LogRecord) -> bool:
        _LastLine.at = time.monotonic()
        return True


_STAMP = _LastLine()


def disabled() -> bool:
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


def bars_shown() -> bool:
    """Whether progress bars are drawn: stderr is a terminal and TQDM_DISABLE is not set. Libraries' own bars
    (transformers' weight loading) follow the same rule: in a log file their carriage returns are noise."""
    return not disabled() and sys.stderr.isatty()


def progress(iterable: Iterable | None = None, desc: str = "", *, total: int | None = None, unit: str = "step",
             lines: bool = True, outermost: bool = False) -> Progress:
    """A loop's progress: iterate over it, or call `update()` and `close()` by hand.

    `lines=False`: in a log, this loop only names its position in its inner loops' lines (its own code logs
    its steps). `outermost=True`: no loop can be running around this one, so any a crash left open are closed.
    """
    if outermost:
        for stale in list(reversed(_open)):
            stale.close()
    return Progress(iterable, desc, total, unit, lines)


class Progress:
    def __init__(self, iterable: Iterable | None, desc: str, total: int | None, unit: str, lines: bool) -> None:
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.desc, self.total, self.unit, self.lines = iterable, desc, total, unit, lines
        self.n = 0
        self.started = time.monotonic()
        self.bar = self._redirect = None
        self.quiet = disabled()
        if bars_shown():
            self._open_bar()
        if _STAMP not in log.filters:
            log.addFilter(_STAMP)
        _open.append(self)

    def _open_bar(self) -> None:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        if not any(p.bar is not None for p in _open):  # the first bar: log lines go above the bars from now on
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()
        self.bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, dynamic_ncols=True,
                        mininterval=0.5, delay=1.0, disable=False)

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.lines and not self.quiet and time.monotonic() - _LastLine.at >= LOG_EVERY_S:
            log.info("%s", self.line())

    def line(self) -> str:
        """`epoch 3/50 · train 40/120 steps · 1.2 steps/s · ETA 1m05s` (the outer loops at their current item)."""
        outer = [f"{p.desc} {p.n + 1}/{p.total}" for p in _open[: _open.index(self)] if p.total] if self in _open else []
        units = self.unit + ("es" if self.unit.endswith(("s", "ch", "sh", "x")) else "s")
        parts = [*outer, f"{self.desc} {self.n}/{self.total} {units}" if self.total else f"{self.desc} {self.n} {units}"]
        seconds = time.monotonic() - self.started
        if self.n and seconds > 0:
            rate = self.n / seconds
            parts.append(f"{rate:.1f} {units}/s" if rate >= 1 else f"{1 / rate:.1f} s/{self.unit}")
            if self.total:
                parts.append(f"ETA {duration(max(self.total - self.n, 0) / rate)}")
        return " · ".join(parts)

    def close(self) -> None:
        if self in _open:
            _open.remove(self)
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


def duration(seconds: float, coarse: bool = False) -> str:
    """`45s`, `1m05s`, `2h03m`; coarse (an estimate, to the nearest minute from a minute on): `45s`, `9m`, `2h05m`."""
    seconds = max(0, round(seconds))
    if coarse and seconds >= 60:
        seconds = round(seconds / 60) * 60
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m" if coarse else f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"
