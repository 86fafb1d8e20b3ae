"""Adapter, Pfeiffer placement after the FFN (UniPELT Eq. 1; gated as in §3.2).

In BERT's output block, with h = dropout(dense(intermediate)) and a the attention output (the block's
residual input), and LN the block's own pretrained LayerNorm (used twice, frozen):
    x = LN(h + a);   out = LN(h + g · Up(ReLU(Down(x))) + a)
g = 1 ungated; gated, g = mean_t sigmoid(Linear(x_t)). On a pre-norm encoder (ModernBERT), where no LayerNorm
follows the FFN block: x = h + a, out = h + g · Up(ReLU(Down(x))) (base.FfnOutput; docs/protocol.md §9).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from ..component import Component, POSITIVE_INT, Setting
from .base import Coefficient, MemberLinear, Members, PeltModel, Selection, ffn_output, mark, scale_grouped

COMPONENT = Component(
    stage="module",
    settings={"bottleneck": Setting(POSITIVE_INT, "adapter size (adapter, UniPELT; MAM's parallel adapter); Figure 2 "
                                                  "sweeps it")},
    gate="the adapter's output Up(ReLU(Down(x))), added to its FFN block: one gate per layer (§3.2)",
    excludes={"parallel_adapter": "two FFN adapters; no method uses both"},
    label="Adapter",
)


class Adapter(nn.Module):
    """Down (H → bottleneck), ReLU, Up (bottleneck → H), both with bias; optionally gated. Members with a smaller
    bottleneck than the group's largest hold zeros in the rest of their slot, which stay zero in training."""

    def __init__(self, members: Members, users: dict[int, DictConfig], hidden_size: int, layer: int) -> None:
        super().__init__()
        self.members = members
        self.users = tuple(sorted(users))
        bottleneck = max(method.bottleneck for method in users.values())
        self.down = MemberLinear(members, hidden_size, bottleneck)
        self.up = MemberLinear(members, bottleneck, hidden_size)
        gated = [bool(users[m].gated) if m in users else False for m in range(members.count)]
        self.coefficient = Coefficient(members, hidden_size, "adapter", layer, gated, [1.0] * members.count)

    def selection(self, x: torch.Tensor) -> Selection:
        return self.members.select(self.users, x.device)

    def forward(self, x: torch.Tensor, selection: Selection) -> torch.Tensor:
        """x: the rows of the selected members (those with an adapter)."""
        grouped = x.reshape(selection.count, -1, x.shape[-1])
        out = self.up.grouped(torch.relu(self.down.grouped(grouped, selection)), selection)
        coefficient = self.coefficient(x, selection)
        return (out if coefficient is None else scale_grouped(out, coefficient)).view(x.shape)

    def init_member(self, slot: int, method: DictConfig) -> None:
        hidden, bottleneck = self.up.weight.shape[1], method.bottleneck
        self.down.init_bert(slot, bottleneck, hidden)
        self.up.init_bert(slot, hidden, bottleneck)
        self.coefficient.init_member(slot)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    gated = [m for m in users if users[m].gated]
    for index, layer in enumerate(model.layers):
        adapter = Adapter(model.members, users, model.hidden_size, index)
        ffn_output(model, layer).adapter = adapter
        mark(model, [*adapter.down.parameters(), *adapter.up.parameters()], users)
        mark(model, adapter.coefficient.gate_parameters(), gated)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for layer in model.layers:
        ffn_output(model, layer).adapter.init_member(slot, method)
