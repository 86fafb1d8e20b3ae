"""Read the config files that ship with peltbench (`conf/`, installed as the package `peltbench.conf`)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

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


# ---------------------------------------------------------------- the user's own config folders

_user_dirs: tuple[str, ...] | None = None  # set by whoever composed the run's config (use_searchpath)


def use_searchpath(searchpath) -> None:
    """The user's own config folders, from Hydra's `hydra.searchpath` (`file://DIR` entries; `pkg://PACKAGE` too):
    a method file there (DIR/method/NAME.yaml) is found by `method_file` as Hydra found it. Called by whoever composed
    the config (peltbench's preflight, peltbench-missing's composer); a Hydra job reads its own (HydraConfig)."""
    global _user_dirs
    _user_dirs = tuple(folder for folder in map(_folder, searchpath or ()) if folder)


def user_config_dirs() -> tuple[str, ...]:
    """The user's own config folders of this process (use_searchpath), else of the Hydra job it runs in."""
    if _user_dirs is not None:
        return _user_dirs
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return tuple(folder for folder in map(_folder, HydraConfig.get().searchpath or ()) if folder)
    except Exception:  # no Hydra, or a config without a searchpath
        pass
    return ()


def _folder(entry) -> str | None:
    """The folder a searchpath entry names (file://DIR, pkg://PACKAGE, or a plain path), absolute; None if none."""
    import os

    entry = str(entry)
    if entry.startswith("pkg://"):
        from .component import find_module

        spec = find_module(entry[len("pkg://"):].replace("/", "."))
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        return locations[0] if locations else None
    return os.path.abspath(os.path.expanduser(entry.removeprefix("file://")))


def method_file(name: str) -> DictConfig | None:
    """Method `name`'s file: peltbench's (conf/method/NAME.yaml), else the first of the user's config folders that has
    one (as Hydra's search path finds it: peltbench's own come first); None if none."""
    packaged = packaged_config(f"method/{name}.yaml")
    if packaged is not None:
        return packaged
    for folder in user_config_dirs():
        found = _user_file(str(Path(folder) / "method" / f"{name}.yaml"))
        if found is not None:
            return found
    return None


def _user_file(path: str) -> DictConfig | None:
    import os

    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _read_user_file(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _read_user_file(path: str, mtime_ns: int, size: int) -> DictConfig | None:
    """A user's config file as it was at (mtime, size): read once per process while unchanged. Never change it."""
    return OmegaConf.load(path)


def shadowing(group: str = "method") -> list[str]:
    """The user's config files of `group` that peltbench ships a file of the same name of: Hydra finds peltbench's
    first, so the user's would silently never run (a method's name is its results folder)."""
    ours = set(options(group))
    return sorted(str(Path(folder) / group / f"{name}.yaml") for folder in user_config_dirs()
                  for name in ours if (Path(folder) / group / f"{name}.yaml").is_file())
