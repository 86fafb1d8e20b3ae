"""What importing peltbench does before torch loads: torch's OpenMP threads spin 1,000 rounds, then sleep
(GOMP_SPINCOUNT=1000; OMP_WAIT_POLICY=PASSIVE for the other OpenMP runtimes) where the user set no policy, in every way
peltbench starts (its console scripts, `python -m`, a SLURM job's worker), so that a busy CPU does not collapse
training and an idle one keeps most of its speed (issue 58; README, "Try it": the table)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON = Path(sys.executable)


def spin_counts(command: list[str], **env: str) -> list[str]:
    """GOMP_SPINCOUNT of each GNU OpenMP runtime the command loads (libgomp prints its settings as it loads when
    OMP_DISPLAY_ENV=VERBOSE): 1000 as peltbench sets it, 300000 with no policy set, 0 where threads wait passively."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_", "GOMP_", "KMP_"))}
    environment.update(env, OMP_DISPLAY_ENV="VERBOSE")
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.findall(r"GOMP_SPINCOUNT = '(\d+)'", done.stderr)


@pytest.fixture(scope="module")
def gnu_openmp() -> None:
    """torch's OpenMP runtime is GNU's (Linux builds), which says how it waits; else (macOS: LLVM's) skip."""
    if not spin_counts([str(PYTHON), "-c", "import torch"]):
        pytest.skip("torch's OpenMP runtime is not GNU libgomp here: it does not print GOMP_SPINCOUNT")


@pytest.mark.parametrize("start", ["console script", "python -m", "SLURM worker"])
def test_torchs_threads_spin_briefly_however_peltbench_starts(start, tiny_checkpoint, gnu_openmp):
    command = {
        "console script": [str(PYTHON.with_name("peltbench-params")), "--model", str(tiny_checkpoint)],
        "python -m": [str(PYTHON), "-m", "peltbench.params", "--model", str(tiny_checkpoint)],
        # submitit's worker unpickles the launcher, importing its module, then runs the runs (torch loads there)
        "SLURM worker": [str(PYTHON), "-c", "import hydra_plugins.peltbench_slurm._launcher, peltbench.runner"],
    }[start]
    counts = spin_counts(command)
    assert counts and set(counts) == {"1000"}


@pytest.mark.parametrize("env, spins", [
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "30000000000"), ({"OMP_WAIT_POLICY": "passive"}, "0"),
    ({"GOMP_SPINCOUNT": "5"}, "5"), ({"KMP_BLOCKTIME": "0"}, "300000")])
def test_a_users_setting_stands(env, spins, gnu_openmp):
    """Any one of the settings given by the user: peltbench sets none (KMP_BLOCKTIME is LLVM's; libgomp ignores it)."""
    assert set(spin_counts([str(PYTHON), "-c", "import peltbench, torch"], **env)) == {spins}


def test_torchs_own_default_spins_long(gnu_openmp):
    """The checks above can fail: torch loaded before peltbench keeps OpenMP's default."""
    assert set(spin_counts([str(PYTHON), "-c", "import torch, peltbench"])) == {"300000"}
