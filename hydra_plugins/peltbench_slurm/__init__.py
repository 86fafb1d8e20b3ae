"""Hydra launcher plugin for peltbench sweeps on SLURM: `hydra/launcher=slurm` (see peltbench's README).

Registers `hydra/launcher=peltbench_slurm` (conf/hydra/launcher/slurm.yaml builds on it) when
hydra-submitit-launcher is installed (`pip install peltbench[slurm]`); without it, it registers nothing.
"""

from importlib.util import find_spec

if find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
    from ._launcher import PeltbenchSlurmConf, PeltbenchSlurmLauncher  # noqa: F401  (registers the launcher)
