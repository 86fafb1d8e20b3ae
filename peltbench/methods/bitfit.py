"""BitFit (Ben Zaken et al. 2021): every bias of BERT trains — Q/K/V, attention output, intermediate,
output, all LayerNorm biases and the pooler (102,912 for BERT-base, METHODS.md)."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from .base import PeltModel


def attach(model: PeltModel, method: DictConfig) -> list[nn.Parameter]:
    return [p for name, p in model.backbone.bert.named_parameters() if name.endswith("bias")]
