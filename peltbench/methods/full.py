"""Fine-tuning: every parameter of the backbone trains (the head as `head:` says).

It changes the backbone itself, so a fine-tuning run cannot share one: it is always a group of one, and
its backbone tensors have no member dimension (`model.unstacked`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from ..component import Component
from .base import PeltModel, mark

COMPONENT = Component(
    stage="backbone",
    alone="fine-tuning trains the backbone itself: it cannot share it with other runs",
)  # no gate: it trains the backbone itself, no contribution of its own that a gate could scale


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    if model.members.count != 1:
        raise ValueError("fine-tuning trains the backbone itself: it cannot share it with other runs")
    mark(model, model.backbone, users, stacked=False)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Nothing to draw: it starts from the checkpoint."""
