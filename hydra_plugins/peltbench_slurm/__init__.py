"""Hydra launcher plugin for peltbench sweeps on SLURM: `hydra/launcher=slurm` (see peltbench's README).

Registers `hydra/launcher=peltbench_slurm` (conf/hydra/launcher/slurm.yaml builds on it) when
hydra-submitit-launcher is installed (`pip install peltbench[slurm]`); without it, it registers nothing.
"""

from importlib.util import find_spec

AVAILABLE = find_spec("hydra_plugins.hydra_submitit_launcher") is not None

if AVAILABLE:
    from ._launcher import PeltbenchSlurmConf, PeltbenchSlurmLauncher  # noqa: F401  (registers the config)


def register() -> None:
    """Register the launcher with Hydra, whose plugin scan misses it in an editable install (hydra#2359); peltbench
    calls this through the `peltbench.launchers` entry point (peltbench.launchers). Nothing without the extra."""
    if AVAILABLE:
        from hydra.core.plugins import Plugins

        Plugins.instance().register(PeltbenchSlurmLauncher)
