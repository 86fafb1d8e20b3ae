"""Hydra launcher plugin for peltbench sweeps in one process: `hydra/launcher=peltbench_local` (the default).

Hydra's basic launcher, plus fused training: with `fuse=true` the compatible runs of a sweep train together
on one frozen backbone (peltbench.fusion). The SLURM launcher runs its array tasks through `run_pack` too.
"""

from ._launcher import PeltbenchLocalConf, PeltbenchLocalLauncher, run_pack  # noqa: F401  (registers the launcher)
