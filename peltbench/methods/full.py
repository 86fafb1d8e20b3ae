"""Fine-tuning: every parameter of the backbone trains (the head as `head:` says)."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from .base import PeltModel


def attach(model: PeltModel, method: DictConfig) -> list[nn.Parameter]:
    return list(model.backbone.bert.parameters())
