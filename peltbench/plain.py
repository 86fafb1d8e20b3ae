"""Plain data read as a config (Plain): what a sweep's runs and a record's config are, without an OmegaConf object
each. A Plain is never changed once made, so what a check answers for it holds for every equal one (peltbench.passes,
the one memo of the checks)."""

from __future__ import annotations


class Plain(dict):
    """A resolved config as plain dicts and lists, read as a DictConfig is read (`cfg.method.lr`, `cfg.get("k")`,
    `cfg["task"]`): what peltbench.missing composes for each run of a sweep, without an OmegaConf object per run. It
    holds no interpolation and no `???` (those are composed by OmegaConf). Never changed once made: runs share its
    unchanged parts."""

    __slots__ = ()

    def __getattr__(self, key: str):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

