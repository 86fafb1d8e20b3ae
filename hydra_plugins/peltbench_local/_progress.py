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

# peltbench.runner.sweep_status of a run that did not train: done before, being run by another process, or its folder
# holding a damaged record (record.damage)
SKIPPED = ("skipped", "running", "damaged")
NOT_DONE = ("failed", "error")    # a failed run (its record says why), a bad input (no record)


SKIPPED_STATES = ("done", "running", "damaged")  # peltbench.missing.STATES of the runs a sweep will skip


def plan_line(packs: list[list[int]], states: dict[int, str]) -> str:
    """`16 runs: 4 already done (skipped), 12 to train in 1 fused group`: the sweep as it is about to run. `packs`: the
    job numbers of each fused group or separate run; `states`: each job's record state (peltbench.missing.STATES).
    A group trains only its members not skipped: it counts as fused if at least two of them are left."""
    left = [[num for num in pack if states[num] not in SKIPPED_STATES] for pack in packs]
    done = sum(state == "done" for state in states.values())
    running = sum(state == "running" for state in states.values())
    damaged = sum(state == "damaged" for state in states.values())
    to_train = sum(len(pack) for pack in left)
    groups = [pack for pack in left if len(pack) > 1]
    fused = sum(len(pack) for pack in groups)
    parts = [f"{done} already done (skipped)"] if done else []
    parts += [f"{running} running elsewhere (skipped)"] if running else []
    parts += [f"{damaged} damaged (skipped: the summary names them)"] if damaged else []
    plan = f"{to_train} to train"
    if groups:
        grouped = f"{len(groups)} fused group{'s' if len(groups) > 1 else ''}"
        plan += f" in {grouped}" if fused == to_train else f", {fused} of them in {grouped}"
    return f"{len(states)} runs: {', '.join([*parts, plan])}"


def status(ret: JobReturn) -> str:
    """What a run's job returned (peltbench.runner.sweep_status); `failed` if it raised."""
    return str(ret._return_value) if ret.status == JobStatus.COMPLETED else "failed"


class SweepProgress:
    """Counts a sweep's finished runs and estimates the time left from the ones that trained (on several devices, the
    device time per run so far times the runs left, shared between the devices training)."""

    def __init__(self, total: int, to_train: int) -> None:
        self.total, self.to_train = total, to_train  # to_train: runs not done when the sweep started
        self.started = time.monotonic()
        self.finished = 0
        self.counts: dict[str, int] = {}
        self.trained = 0
        self.trained_seconds = 0.0  # on several devices: the devices' seconds, added up
        self.parallel = 1  # devices training at once (hydra.launcher.devices): the time left is shared between them

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
                 (("skipped", "skipped"), ("pruned", "pruned"), ("running", "running elsewhere"), ("damaged", "damaged"),
                  ("failed", "failed"), ("error", "bad input"))
                 if self.counts.get(key)]
        text = f"{runs} of {self.total} done" + (f" ({', '.join(notes)})" if notes else "")
        text += f" · {duration(time.monotonic() - self.started)} elapsed"
        if self.finished < self.total and self.trained and self.to_train:
            left = self.trained_seconds / self.trained * self.to_train / max(1, self.parallel)
            text += f" · ETA {duration(left, coarse=True)}"
        return text
