"""Progress of long loops (epochs, training steps, evaluation batches, tokenisation), in one place.

    for batch in progress(batches, "dev", unit="batch"): ...
    bar = progress(total=50, desc="epoch", unit="epoch", lines=False, outermost=True); bar.update(); bar.close()

- stderr is a terminal: a tqdm bar per loop (count, rate, elapsed, ETA); the console's log lines are printed above
  the bars instead of through them.
- otherwise (a log file, a pipe, SLURM): no bars. Once nothing has been logged for LOG_EVERY_S seconds, the loop
  running then logs one line naming the loops it is inside, and the run's ETA once it can be estimated:
  `epoch 3/50 · train 40/120 steps · 1.2 steps/s · ETA 1m05s · run ETA ≤ 48m` (≤: early stopping may end it
  sooner); a loop at its end says `done in 12s` instead of an ETA.
- a loop with `advances_outer=True` (an epoch's training steps) moves the loop around it by its fraction, so the
  epoch bar (its ETA the run's, to the last epoch) and the run ETA move during the first epoch too.
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
log.addFilter(_STAMP)  # from import on, so a run's first lines (`run: ...`) restart the silence too


def disabled() -> bool:
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


def bars_shown() -> bool:
    """Whether progress bars are drawn: stderr is a terminal and TQDM_DISABLE is not set. Libraries' own bars
    (transformers' weight loading) follow the same rule: in a log file their carriage returns are noise."""
    return not disabled() and sys.stderr.isatty()


def progress(iterable: Iterable | None = None, desc: str = "", *, total: int | None = None, unit: str = "step",
             lines: bool = True, outermost: bool = False, advances_outer: bool = False,
             delay: float | None = None) -> Progress:
    """A loop's progress: iterate over it, or call `update()` and `close()` by hand.

    `lines=False`: in a log, this loop only names its position in its inner loops' lines (its own code logs
    its steps). `outermost=True`: no loop can be running around this one, so any a crash left open are closed.
    `delay`: a loop that is often quick (reading a results dir's records): its bar shows once it has run that many
    seconds, as a plain count (not an epoch bar's tenths), even where it is the only loop.
    """
    if outermost:
        for stale in list(reversed(_open)):
            stale.close()
    bar = Progress(iterable, desc, total, unit, lines, delay)
    bar.outer = _open[-2] if advances_outer and len(_open) > 1 else None
    return bar


class Progress:
    def __init__(self, iterable: Iterable | None, desc: str, total: int | None, unit: str, lines: bool,
                 delay: float | None = None) -> None:
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.desc, self.total, self.unit, self.lines = iterable, desc, total, unit, lines
        self.n = 0
        self.partial = 0.0  # the fraction of the current item done (`advances_outer` loops inside set it)
        self.outer: Progress | None = None
        self.started = time.monotonic()
        self.bar = self._redirect = None
        self.quiet = disabled()
        if bars_shown():
            self._open_bar(outermost=not _open, delay=delay)
        _open.append(self)

    def _open_bar(self, outermost: bool, delay: float | None = None) -> None:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        if not any(p.bar is not None for p in _open):  # the first bar: log lines go above the bars from now on
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()
        # The outermost bar (a run's epochs) shows at once, its count to a tenth: inner loops move it (`advance`).
        shape = {"delay": 0.0, "bar_format": "{desc} {n:.1f}/{total_fmt} |{bar}| [{elapsed}<{remaining}]"} \
            if outermost and delay is None else {"delay": 1.0 if delay is None else delay}
        self.bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, dynamic_ncols=True,
                        mininterval=0.5, disable=False, **shape)

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        self.partial = 0.0
        if self.outer is not None and self.total:
            self.outer.advance(self.n / self.total)
        if self.bar is not None:
            self.bar.n = self.n
            self.bar.update(0)
        elif (self.lines and not self.quiet and time.monotonic() - _LastLine.at >= LOG_EVERY_S
              and log.isEnabledFor(logging.INFO)):  # unlogged (no handler takes INFO), a line would be made each step
            log.info("%s", self.line())

    def advance(self, fraction: float) -> None:
        """The current item is `fraction` done (an inner loop's share): the bar and the run ETA move with it."""
        self.partial = min(max(fraction, 0.0), 1.0)
        if self.bar is not None:
            self.bar.n = self.n + self.partial
            self.bar.update(0)

    def eta(self) -> float | None:
        """Seconds left at the rate so far, counting the current item's done fraction; None before any progress."""
        done = self.n + self.partial
        seconds = time.monotonic() - self.started
        if not self.total or done <= 0 or seconds <= 0:
            return None
        return max(self.total - done, 0) * seconds / done

    def line(self) -> str:
        """`epoch 3/50 · train 40/120 steps · 1.2 steps/s · ETA 1m05s` (the outer loops at their current item)."""
        outer = [f"{p.desc} {p.n + 1}/{p.total}" for p in _open[: _open.index(self)] if p.total] if self in _open else []
        units = self.unit + ("es" if self.unit.endswith(("s", "ch", "sh", "x")) else "s")
        parts = [*outer, f"{self.desc} {self.n}/{self.total} {units}" if self.total else f"{self.desc} {self.n} {units}"]
        seconds = time.monotonic() - self.started
        if self.n and seconds > 0:
            rate = self.n / seconds
            parts.append(f"{rate:.1f} {units}/s" if rate >= 1 else f"{1 / rate:.1f} s/{self.unit}")
            if self.total and self.n >= self.total:
                parts.append(f"done in {duration(seconds)}")
            elif self.total:
                parts.append(f"ETA {duration(max(self.total - self.n, 0) / rate)}")
        run = _open[0] if self in _open and _open[0] is not self and not _open[0].lines else None
        left = run.eta() if run is not None else None
        if left is not None:
            parts.append(f"run ETA ≤ {duration(left, coarse=True)}")
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
