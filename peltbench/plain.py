"""Plain data read as a config (Plain): what a sweep's runs and a record's config are, without an OmegaConf object
each; and what a pure function answered for a Plain node, kept by the node's identity (`once_per_node`)."""

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


def once_per_node(what, node, compute):
    """compute(node), once for this very node where it is a Plain: a sweep's runs share the nodes of their composed
    config that their values leave alone (a Plain is never changed once made), so one answer (None too) serves them
    all. `what` names the question (compute itself, or a name where compute is made per call); `compute` must be a
    pure function of the node: a check that raises is asked again next time. Anything but a Plain may change: asked
    each time."""
    if type(node) is not Plain:
        return compute(node)
    found = _KNOWN.get((what, id(node)))
    if found is not None and found[0] is node:
        return found[1]
    answer = compute(node)
    if len(_KNOWN) >= 4096:  # a run's own nodes (its method, with its lr) come once each: a few thousand at most
        _KNOWN.clear()
    _KNOWN[what, id(node)] = node, answer
    return answer
