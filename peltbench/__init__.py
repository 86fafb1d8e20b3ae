"""peltbench: few-shot GLUE sweeps of parameter-efficient language-model tuning (UniPELT, ACL 2022)."""

import os
from importlib.metadata import PackageNotFoundError, version

# Before torch loads (every entry point imports this first): torch's OpenMP threads otherwise spin-wait between
# parallel regions, and on a busy CPU a spinning thread holds the core the working one needs (README, "Try it": 30 s a
# training step instead of 0.5 s). Waiting passively changes no number; a policy the user set stands. Child processes
# (launchers' workers, SLURM jobs) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    __version__ = version("peltbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"


class UserError(Exception):
    """A problem with the user's config or inputs: reported as one line, and no result record is written."""


def load_run(run_dir, device=None, *, data_dir=None, model=None):
    """Rebuild a run saved with save.weights=true on its backbone; `.predict()` rescores its test set (runner.load_run).
    `data_dir=` and `model=` say where the run's data and model are, where not where its record says."""
    from .runner import load_run as load

    return load(run_dir, device, data_dir=data_dir, model=model)
