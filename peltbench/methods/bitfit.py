"""BitFit (Ben Zaken et al. 2021): every bias of BERT trains — Q/K/V, attention output, intermediate,
output, all LayerNorm biases and the pooler (102,912 for BERT-base, METHODS.md)."""

from __future__ import annotations

from omegaconf import DictConfig

from .base import MemberBias, MemberLayerNorm, PeltModel, mark, member_affine


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    member_affine(model)
    modules = [m for m in model.backbone.bert.modules() if isinstance(m, (MemberBias, MemberLayerNorm))]
    mark(model, [m.bias for m in modules], users)
    for module in modules:
        module.users = tuple(sorted(set(module.users) | set(users)))


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Nothing to draw: the biases start from the checkpoint."""
