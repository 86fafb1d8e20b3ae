"""Plain data read as a config (Plain): what a sweep's runs and a record's config are, without an OmegaConf object
each; and what a pure function answered for a Plain node, kept by the node's identity (`known`, `remember`)."""

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


_KNOWN: dict[tuple, tuple] = {}  # (what, id(node)) -> (node, answer) for Plain nodes (held, so their ids stay theirs)


def known(what, node):
    """What `what` (a pure function of the node, or its name) answered for this very node, or None: a sweep's runs
    share the nodes of their composed config that their values leave alone (a Plain is never changed once made), so
    one answer serves them all."""
    found = _KNOWN.get((what, id(node))) if type(node) is Plain else None
    return found[1] if found is not None and found[0] is node else None


def remember(what, node, answer) -> None:
    """Keep `answer` for `known` (only for a Plain node: anything else may change)."""
    if type(node) is Plain:
        if len(_KNOWN) >= 4096:  # a run's own nodes (its method, with its lr) come once each: a few thousand at most
            _KNOWN.clear()
        _KNOWN[what, id(node)] = node, answer
