"""peltbench: few-shot GLUE sweeps of parameter-efficient language-model tuning (UniPELT, ACL 2022)."""

import os
from importlib.metadata import PackageNotFoundError, version

# Before torch loads (every entry point imports this first): how torch's OpenMP threads wait for the next operator.
# Torch's default spins 300,000 rounds (GNU libgomp, which Linux wheels use), holding for milliseconds a core that a
# busy machine's other processes need: with four busy loops beside it a step took 4.5 times as long as ours. Sleeping
# at once (OMP_WAIT_POLICY=PASSIVE) costs an idle machine a wake-up per operator: 1.6 times as long a step. A spin of
# 1,000 rounds bridges the gap between two operators on an idle machine and soon gives up on a busy one (README, "Try
# it": the table). libgomp reads GOMP_SPINCOUNT before the policy; the policy is for the other runtimes (macOS's
# libomp). Waiting changes no number. Set any of these and peltbench sets none; child processes (launchers' workers,
# SLURM jobs) inherit them.
if not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"} & set(os.environ):
    os.environ.update(GOMP_SPINCOUNT="1000", OMP_WAIT_POLICY="PASSIVE")

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
