"""Hydra launcher plugin for peltbench sweeps in one process: `hydra/launcher=peltbench_local` (the default), and
the sweeper of every peltbench sweep, `hydra/sweeper=peltbench` (the default: _sweeper.py).

Hydra's basic launcher, plus fused training: with `fuse=true` the compatible runs of a sweep train together
on one frozen backbone (peltbench.fusion), and several devices: `hydra.launcher.devices=[cuda:0,cuda:1]` trains the
sweep's groups on one worker process per device (_pool.py). The SLURM launcher runs its array tasks through
`run_pack` too, and a task given several GPUs through the same workers.
"""

from ._launcher import PeltbenchLocalConf, PeltbenchLocalLauncher, run_pack  # noqa: F401  (registers the config)
from ._sweeper import PeltbenchSweeper, PeltbenchSweeperConf  # noqa: F401  (registers the config)


def register() -> None:
    """Register the launcher with Hydra, whose plugin scan misses it in an editable install (hydra#2359); peltbench
    calls this through the `peltbench.launchers` entry point (peltbench.launchers)."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(PeltbenchLocalLauncher)
    Plugins.instance().register(PeltbenchSweeper)
