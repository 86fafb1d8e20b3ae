"""A sweep on several devices: `peltbench -m ... hydra.launcher.devices=[cuda:0,cuda:1]` (or `all`, or `[cpu,cpu]`).

The local launcher (hydra_plugins/peltbench_local/_pool.py) plans the sweep once, as for one device, and starts one
worker process per entry of `hydra.launcher.devices`; each trains the groups handed to it, one at a time, as a
one-device sweep trains them. This module holds what needs no Hydra, so that preflight (peltbench.cli) can refuse a
bad entry in one line before anything starts:

- which devices an entry list names (`sweep_devices`), and whether a run's own `device` lets it train on them;
- what a worker's environment is before torch touches CUDA (`worker_environment`): CUDA_VISIBLE_DEVICES naming its
  GPU alone, so that a run's `device=auto` is `cuda` there as in a one-device sweep and its record is the same, or
  none for a `cpu` entry; and OMP_NUM_THREADS, its share of the cores;
- which group goes first (`hand_out_order`): the longest by config.planned_work, so that the last group to finish
  is a short one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

from . import UserError

ALL = "all"  # every visible GPU
_ENTRY = re.compile(r"^(cpu|cuda:\d+)$")


def sweep_devices(spec, gpus: Callable[[], int] | None = None) -> list[str] | None:
    """The devices of `hydra.launcher.devices`: None (unset: the sweep trains in its own process, on each run's
    `device`), or one worker's device per entry, `cpu` or `cuda:N`; `all` is every visible GPU. `gpus()`: how many
    CUDA GPUs are visible (asked only for `all` or a `cuda:N` entry). A bad value is refused in one line."""
    if spec is None:
        return None
    key = "hydra.launcher.devices"
    if isinstance(spec, str) and spec.strip().lower() in (ALL, "cuda:*"):
        count = (gpus or visible_gpus)()
        if not count:
            raise UserError(f"{key}={spec}: no CUDA GPU is visible here (CUDA_VISIBLE_DEVICES="
                            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); on a CPU give [cpu,cpu]")
        return [f"cuda:{index}" for index in range(count)]
    entries = [str(entry).strip() for entry in spec] if isinstance(spec, (list, tuple)) or _listlike(spec) else None
    shown = f"[{','.join(entries)}]" if entries is not None else str(spec)
    if not entries:
        raise UserError(f"{key}={shown}: give a list of devices, e.g. [cuda:0,cuda:1] or [cpu,cpu], or `all` (every "
                        f"visible GPU)")
    bad = [entry for entry in entries if not _ENTRY.match(entry)]
    if bad:
        raise UserError(f"{key}={shown}: {bad[0]} is not a device: give cpu or cuda:N for each worker (or `all`, every "
                        f"visible GPU)")
    if len({entry.split(":")[0] for entry in entries}) > 1:
        raise UserError(f"{key}={shown}: all CUDA or all CPU (a record names its device, and which worker takes a "
                        f"group is not fixed)")
    if entries[0].startswith("cuda"):
        count = (gpus or visible_gpus)()
        beyond = [entry for entry in entries if int(entry.split(":")[1]) >= count]
        if beyond:
            seen = f"{count} visible GPU{'s' if count != 1 else ''}" + (f" (cuda:0-{count - 1})" if count > 1 else "")
            raise UserError(f"{key}={shown}: {beyond[0]}: this machine has {seen if count else 'no visible GPU'}")
    return entries


def _listlike(spec) -> bool:
    """An OmegaConf ListConfig (not imported here: this module is read before anything heavy)."""
    return hasattr(spec, "__iter__") and not isinstance(spec, (str, bytes, dict)) and not hasattr(spec, "keys")


def visible_gpus() -> int:
    """How many CUDA GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 without CUDA. Imports torch."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_run_device(device: str, devices: Sequence[str]) -> None:
    """A run of a sweep on `devices` trains on its worker's device: its own `device` must be `auto` or that device's
    kind (`cuda`, `cpu`); one GPU named (`cuda:1`) is refused, as it names a GPU the worker does not see."""
    kind = devices[0].split(":")[0]
    if str(device) not in ("auto", kind):
        raise UserError(f"device={device} with hydra.launcher.devices=[{','.join(devices)}]: each worker trains on its "
                        f"own device; leave device=auto (or {kind})")


def worker_environment(device: str, devices: Sequence[str], environ: dict | None = None) -> dict[str, str]:
    """What a worker's environment changes, set before torch touches CUDA: CUDA_VISIBLE_DEVICES its GPU alone (the
    N-th of those this process sees: cuda:1 under CUDA_VISIBLE_DEVICES=4,5 is GPU 5), or none for `cpu`; and
    OMP_NUM_THREADS its share of the cores (SLURM's allocation where there is one), unless the user set it (then it
    is each worker's, as it would be each command's)."""
    environ = os.environ if environ is None else environ
    changes: dict[str, str] = {}
    if device == "cpu":
        changes["CUDA_VISIBLE_DEVICES"] = ""
    else:
        index = int(device.split(":")[1])
        visible = [gpu for gpu in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if gpu.strip()]
        changes["CUDA_VISIBLE_DEVICES"] = visible[index] if "CUDA_VISIBLE_DEVICES" in environ else str(index)
    if "OMP_NUM_THREADS" not in environ:
        changes["OMP_NUM_THREADS"] = str(worker_threads(len(devices), environ))
    return changes


def worker_threads(workers: int, environ: dict | None = None) -> int:
    """Each worker's share of the cores this process may use (SLURM's `--cpus-per-task` where it is set), at least 1."""
    environ = os.environ if environ is None else environ
    allocated = environ.get("SLURM_CPUS_PER_TASK", "")
    cores = int(allocated) if allocated.isdigit() else len(os.sched_getaffinity(0))
    return max(1, cores // max(1, workers))


def hand_out_order(work: Sequence[float | None]) -> list[int]:
    """The order in which a sweep's groups go to its workers (indices into `work`, each group's config.planned_work):
    the longest first, ties in sweep order; a group whose length the config cannot tell (k=all) before all."""
    return sorted(range(len(work)), key=lambda index: (work[index] is not None, -(work[index] or 0.0), index))
