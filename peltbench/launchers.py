"""Making peltbench's Hydra launchers known: `peltbench_local` (the default, conf/config.yaml) and `hydra/launcher=slurm`.

Hydra finds launchers by scanning the `hydra_plugins` namespace package, which an editable install (setuptools >= 64)
hides from its scan (hydra#2359). So each plugin package offers a `register()` function under the entry-point group
`peltbench.launchers` (pyproject.toml), and peltbench calls what that group lists: the plugins depend on peltbench,
and peltbench never imports them.
"""

from __future__ import annotations

from importlib.metadata import distributions

from . import UserError

ENTRY_POINTS = "peltbench.launchers"


def register_launchers() -> None:
    """Register every launcher installed under ENTRY_POINTS with Hydra (the SLURM one registers itself only when
    hydra-submitit-launcher is installed)."""
    # Every installed copy's entry points, not only the first copy's (`entry_points()`): a stale peltbench.egg-info in
    # the working directory must not hide the installed ones.
    found = {entry.name: entry for dist in distributions() for entry in dist.entry_points if entry.group == ENTRY_POINTS}
    if not found:
        raise UserError("peltbench's Hydra launchers are not installed (no 'peltbench.launchers' entry points): "
                        "reinstall peltbench (make install, or pip install -e .)")
    for entry in found.values():
        entry.load()()
