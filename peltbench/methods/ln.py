"""LN-tuning (Qi et al. 2022, Eq. 1): the gain and bias of every LayerNorm train, from their pretrained
values — the embeddings' LayerNorm and two per layer (38,400 for BERT-base, METHODS.md)."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from .base import PeltModel


def attach(model: PeltModel, method: DictConfig) -> list[nn.Parameter]:
    norms = [m for m in model.backbone.bert.modules() if isinstance(m, nn.LayerNorm)]
    return [p for norm in norms for p in norm.parameters()]
