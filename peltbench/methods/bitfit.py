"""BitFit (Ben Zaken et al. 2021): every bias of the pretrained model trains — in BERT Q/K/V, attention output,
intermediate, output, all LayerNorm biases and the pooler (102,912 for BERT-base, docs/protocol.md). A Linear or LayerNorm
the checkpoint left without a bias (all of ModernBERT's) has a bias of zero, which BitFit trains from zero."""

from __future__ import annotations

from omegaconf import DictConfig

from ..component import Component
from .base import MemberBias, MemberLayerNorm, PeltModel, mark, member_affine

COMPONENT = Component(stage="affine", label="BitFit", arxiv="2106.10199")
# no gate: it trains the backbone's own biases, no contribution of its own that a gate could scale


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    member_affine(model)
    modules = [m for m in model.backbone.modules() if isinstance(m, (MemberBias, MemberLayerNorm))]
    mark(model, [m.bias for m in modules], users)
    for module in modules:
        module.users = tuple(sorted(set(module.users) | set(users)))


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Nothing to draw: the biases start from the checkpoint."""
