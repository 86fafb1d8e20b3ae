"""Which runs of a sweep train together (`fuse=true`): compatible runs share one frozen backbone.

Compatible = the same backbone, task, K, protocol (its split and its evaluation schedule), max length and batch size,
read from the same data, on the same device and precision, with the same gate pooling (padded pooling pads every batch
to max length) and the settings their components say a group shares (`group_by`: prompt tuning's prompt length, as it
puts P embeddings in front of every row, shifting its tokens' positions). Anything else forms a group of its own. A
component declared `alone` always trains alone: fine-tuning, and any that trains a tensor every member would share
(`mark(..., stacked=False)`), which a model build refuses without that declaration (methods.base.check_marks: the plan
is made before torch, from declarations, and cannot see what a component marks). A group holds at most
`fuse_members` runs (the runner may split it further to fit the device's free memory: runner.memory_cap).

This module imports nothing heavy: launchers call it before any model loads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from omegaconf import DictConfig

from .component import declaration
from .objectives import group_key as objective_key
from .protocols import protocol_name
from .record import model_identity

log = logging.getLogger("peltbench")


def group_key(cfg: DictConfig) -> tuple | None:
    """Runs with equal keys can train together; None: this run trains alone."""
    if not cfg.get("fuse", False) or trains_alone(cfg.method):
        return None
    padded = bool(cfg.method.get("gated", False)) and cfg.method.get("gate_pooling", "masked") == "padded"
    schedule = (protocol_name(cfg), cfg.train.get("max_steps"), cfg.train.get("eval_every"))  # K's meaning, dev periods
    return (model_identity(str(cfg.model.name)), cfg.task.name, str(cfg.k), cfg.train.max_length,
            cfg.train.batch_size, str(cfg.data.dir), str(cfg.device), str(cfg.precision), padded, schedule,
            shared_settings(cfg.method), objective_key(cfg))


def trains_alone(method) -> bool:
    """Whether a component of the method never shares its backbone (its declaration's `alone`: fine-tuning)."""
    return any(declaration(str(name)).alone for name in method.components)


def shared_settings(method) -> tuple:
    """The settings a fused group's members share, as the method's components declare them (`group_by`: prompt
    tuning's prompt_length, which shifts every token's position)."""
    return tuple((str(name), key, str(method[key])) for name in method.components
                 for key in declaration(str(name)).group_by)


def plan_groups(cfgs: Sequence[DictConfig]) -> list[list[int]]:
    """The runs (indices into `cfgs`) grouped for training, in the order of each group's first run.

    Runs that cannot fuse are groups of one; compatible runs fill groups of up to `fuse_members` in sweep order.
    Under successive halving (`halving=η`, peltbench.halving) the runs of one bracket (a method × task × K whose
    `method.*` settings are compared) go into one group, each candidate's seeds side by side; a bracket larger than
    `fuse_members` is split between candidates (each part compared on its own), and a candidate with more seeds than
    `fuse_members` between its seeds; the plan says so in the log.
    """
    groups: list[list[int]] = []
    open_group: dict[tuple, list[int]] = {}
    for unit in _units(cfgs):
        cfg = cfgs[unit[0]]
        key = group_key(cfg)
        if key is None:
            groups.extend([index] for index in unit)
            continue
        cap = max(1, int(cfg.get("fuse_members", 1)))
        for part in _parts(unit, cfgs, cap):
            group = open_group.get(key)
            if group is None or len(group) + len(part) > cap and (len(unit) > 1 or len(group) >= cap):
                group = open_group[key] = []
                groups.append(group)
            group.extend(part)
    return groups


def fused_packs(cfgs: Sequence[DictConfig]) -> tuple[list[list[int]], list[bool]]:
    """The runs (indices into `cfgs`) grouped as they will train (plan_groups), and for each group whether it is
    fine-tuning that could not fuse although fuse=true (a launcher says so in its log)."""
    groups = plan_groups(cfgs)
    return groups, [bool(cfgs[group[0]].get("fuse", False)) and trains_alone(cfgs[group[0]].method) for group in groups]


def _units(cfgs: Sequence[DictConfig]) -> list[list[int]]:
    """Runs that should share a group: a halving bracket's runs (candidate by candidate), else each run alone."""
    from .halving import bracket_id, candidate_name, eta

    units: list[list[int]] = []
    brackets: dict[tuple, list[int]] = {}
    for index, cfg in enumerate(cfgs):
        key = group_key(cfg)
        if key is None or eta(cfg) is None:
            units.append([index])
            continue
        bracket = (key, bracket_id(cfg))
        if bracket not in brackets:
            brackets[bracket] = []
            units.append(brackets[bracket])
        brackets[bracket].append(index)
    for unit in brackets.values():
        first = {}
        for index in unit:
            first.setdefault(candidate_name(cfgs[index]), len(first))
        unit.sort(key=lambda index: first[candidate_name(cfgs[index])])  # stable: seeds stay in sweep order
    return units


def _parts(unit: list[int], cfgs: Sequence[DictConfig], cap: int) -> list[list[int]]:
    """A unit in parts of at most `cap` runs, cut between candidates where it must be cut (and said so)."""
    if len(unit) <= cap:
        return [unit]
    from .halving import bracket_id, candidate_name

    candidates: list[list[int]] = []
    for index in unit:
        if not candidates or candidate_name(cfgs[candidates[-1][0]]) != candidate_name(cfgs[index]):
            candidates.append([])
        candidates[-1].append(index)
    parts: list[list[int]] = [[]]
    for runs in candidates:
        if len(runs) > cap:
            log.warning("halving: the %d seeds of %s cannot share a group (fuse_members=%d): each part of them is "
                        "compared on its own", len(runs), candidate_name(cfgs[runs[0]]), cap)
        for start in range(0, len(runs), cap):
            piece = runs[start : start + cap]
            if parts[-1] and len(parts[-1]) + len(piece) > cap:
                parts.append([])
            parts[-1].extend(piece)
    log.warning("halving: bracket %s has %d runs, more than fuse_members=%d: its candidates are compared in %d groups, "
                "each on its own (raise fuse_members to compare them all)", bracket_id(cfgs[unit[0]]), len(unit), cap,
                len(parts))
    return parts
