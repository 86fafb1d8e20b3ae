"""Which runs of a sweep train together (`fuse=true`): compatible runs share one frozen backbone.

Compatible = the same backbone, task, K, protocol (its split and its evaluation schedule), max length and batch size,
read from the same data, on the same device and precision, with the same gate pooling (padded pooling pads every batch
to max length) and the same prompt length (prompt tuning puts P embeddings in front of every row, shifting its
tokens' positions; 0 without prompts). Anything else forms a group of its own. Fine-tuning changes the backbone, so it always trains alone. A group holds at
most `fuse_members` runs (on CUDA the runner may split it further to fit the GPU's memory: runner.memory_cap).

This module imports nothing heavy: launchers call it before any model loads.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from .protocols import protocol_name
from .record import model_identity


def group_key(cfg: DictConfig) -> tuple | None:
    """Runs with equal keys can train together; None: this run trains alone."""
    if not cfg.get("fuse", False) or "full" in cfg.method.components:
        return None
    padded = bool(cfg.method.get("gated", False)) and cfg.method.get("gate_pooling", "masked") == "padded"
    prompt = int(cfg.method.prompt_length) if "prompt" in cfg.method.components else 0  # prompts shift positions
    schedule = (protocol_name(cfg), cfg.train.get("max_steps"), cfg.train.get("eval_every"))  # K's meaning, dev periods
    return (model_identity(str(cfg.model.name)), cfg.task.name, str(cfg.k), cfg.train.max_length,
            cfg.train.batch_size, str(cfg.data.dir), str(cfg.device), str(cfg.precision), padded, schedule, prompt)


def plan_groups(cfgs: Sequence[DictConfig]) -> list[list[int]]:
    """The runs (indices into `cfgs`) grouped for training, in the order of each group's first run.

    Runs that cannot fuse are groups of one; compatible runs fill groups of up to `fuse_members` in sweep order.
    """
    groups: list[list[int]] = []
    open_group: dict[tuple, list[int]] = {}
    for index, cfg in enumerate(cfgs):
        key = group_key(cfg)
        if key is None:
            groups.append([index])
            continue
        group = open_group.get(key)
        if group is None or len(group) >= max(1, int(cfg.get("fuse_members", 1))):
            group = open_group[key] = []
            groups.append(group)
        group.append(index)
    return groups
