"""Read the config files that ship with peltbench (`conf/`, installed as the package `peltbench.conf`)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from omegaconf import DictConfig, OmegaConf


@lru_cache(maxsize=None)
def packaged_config(relative: str) -> DictConfig | None:
    """e.g. `packaged_config("method/adapter.yaml")`; None if there is no such file."""
    path = resources.files("peltbench.conf").joinpath(relative)
    return OmegaConf.create(path.read_text()) if path.is_file() else None


def options(group: str) -> list[str]:
    """The names a config group offers, e.g. `options("method")`; a file in a subfolder by its path, as Hydra takes
    it (`+experiment=glue/roberta_base`)."""
    return sorted(_names(resources.files("peltbench.conf").joinpath(group), ""))


def _names(folder, prefix: str) -> list[str]:
    names = []
    for path in folder.iterdir():
        if path.is_dir() and not path.name.startswith(("_", ".")):
            names += _names(path, f"{prefix}{path.name}/")
        elif path.name.endswith(".yaml"):
            names.append(prefix + path.name.removesuffix(".yaml"))
    return names
