"""peltbench's Hydra launchers: `peltbench_local` (the default, conf/config.yaml) and `hydra/launcher=slurm`.

Importing a plugin registers its config; registering its class by hand is needed because an editable install
(setuptools >= 64) hides `hydra_plugins.peltbench_*` from Hydra's plugin scan (hydra#2359).
"""

from __future__ import annotations


def register_launchers() -> None:
    """Make both launchers available to Hydra (the SLURM one when the `slurm` extra is installed)."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.peltbench_local import PeltbenchLocalLauncher

    Plugins.instance().register(PeltbenchLocalLauncher)
    try:
        from hydra_plugins.peltbench_slurm import PeltbenchSlurmLauncher
    except ImportError:  # hydra-submitit-launcher is not installed
        return
    Plugins.instance().register(PeltbenchSlurmLauncher)
