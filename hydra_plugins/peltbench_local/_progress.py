"""A sweep's progress as log lines: `run 3 of 12 done (2 skipped) · 4m10s elapsed · ETA 9m`.

Plain lines, one per finished run or fused group, so a log file read later (or a terminal) shows the same thing.
The ETA counts only runs that will train: a run already done (or being trained by another process) is skipped at
almost no cost, so the time per run comes from the runs trained so far, times the runs left to train.
"""

from __future__ import annotations

import time
from typing import Iterable

from hydra.core.utils import JobReturn, JobStatus

from peltbench.progress import duration

SKIPPED = ("skipped", "running")  # peltbench.runner.sweep_status: done before, or being run by another process
NOT_DONE = ("failed", "error")    # a failed run (its record says why), a bad input (no record)


def status(ret: JobReturn) -> str:
    """What a run's job returned (peltbench.runner.sweep_status); `failed` if it raised."""
    return str(ret._return_value) if ret.status == JobStatus.COMPLETED else "failed"


class SweepProgress:
    """Counts a sweep's finished runs and estimates the time left from the ones that trained."""

    def __init__(self, total: int, to_train: int) -> None:
        self.total, self.to_train = total, to_train  # to_train: runs not done when the sweep started
        self.started = time.monotonic()
        self.finished = 0
        self.counts: dict[str, int] = {}
        self.trained = 0
        self.trained_seconds = 0.0

    def add(self, statuses: Iterable[str], seconds: float) -> None:
        """A run or a fused group finished after `seconds`, its runs' statuses as their jobs returned them."""
        statuses = list(statuses)
        self.finished += len(statuses)
        for value in statuses:
            self.counts[value] = self.counts.get(value, 0) + 1
        trained = sum(value not in SKIPPED for value in statuses)
        if trained:
            self.trained += trained
            self.trained_seconds += seconds
        self.to_train = max(0, self.to_train - trained)

    def line(self, first: int, last: int) -> str:
        """`run 3 of 12 done (2 skipped) · 4m10s elapsed · ETA 9m` for runs first..last (1-based) of the sweep."""
        runs = f"run {first}" if first == last else f"runs {first}-{last}"
        notes = [f"{self.counts.get(key, 0)} {words}" for key, words in
                 (("skipped", "skipped"), ("pruned", "pruned"), ("running", "running elsewhere"), ("failed", "failed"),
                  ("error", "bad input"))
                 if self.counts.get(key)]
        text = f"{runs} of {self.total} done" + (f" ({', '.join(notes)})" if notes else "")
        text += f" · {duration(time.monotonic() - self.started)} elapsed"
        if self.finished < self.total and self.trained and self.to_train:
            text += f" · ETA {duration(self.trained_seconds / self.trained * self.to_train, coarse=True)}"
        return text
