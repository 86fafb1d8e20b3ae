"""LN-tuning (Qi et al. 2022, Eq. 1): the gain and bias of every LayerNorm of the pretrained model train, from their
pretrained values — in BERT the embeddings' LayerNorm and two per layer (38,400 for BERT-base, docs/protocol.md). A
LayerNorm without a bias (ModernBERT's) has a bias of zero, which LN-tuning trains from zero."""

from __future__ import annotations

from omegaconf import DictConfig

from ..component import Component
from .base import MemberLayerNorm, PeltModel, mark, member_affine

COMPONENT = Component(stage="affine", label="LN-tuning")
# no gate: it trains the backbone's own LayerNorms, no contribution of its own that a gate could scale


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    member_affine(model)
    norms = [m for m in model.backbone.modules() if isinstance(m, MemberLayerNorm)]
    mark(model, [p for norm in norms for p in (norm.weight, norm.bias)], users)
    for norm in norms:
        norm.users = tuple(sorted(set(norm.users) | set(users)))


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Nothing to draw: the gains and biases start from the checkpoint."""
