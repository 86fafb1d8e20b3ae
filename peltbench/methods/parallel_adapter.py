"""Scaled parallel FFN adapter, the FFN half of the MAM adapter (He et al. 2022, "Towards a Unified View").

Computed from the FFN's input x (the attention output a) and added before the block's residual and LayerNorm:
    out = LN(dropout(dense(intermediate)) + s · Up(ReLU(Down(a))) + a)
(on a pre-norm encoder, ModernBERT: MLP(a) + s · Up(ReLU(Down(a))), a the MLP's input; base.FfnOutput).
Down is kaiming-uniform (a = √5, PyTorch's Linear default) with zero bias; Up starts at zero, so the
model starts exactly as the pretrained one (docs/protocol.md).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from ..component import Component, POSITIVE_NUMBER, Setting, setting_of
from .base import MemberLinear, Members, PeltModel, Selection, draw, ffn_output, mark, scale_grouped
from .lora import kaiming

COMPONENT = Component(
    stage="module", after=("prefix",),
    settings={"bottleneck": setting_of("adapter", "bottleneck"),
              "adapter_scale": Setting(POSITIVE_NUMBER, "MAM's parallel-adapter scale")},
)  # no gate: its output has the constant scale adapter_scale (He et al.); no gate was defined for it


class ParallelAdapter(nn.Module):
    def __init__(self, members: Members, users: dict[int, DictConfig], hidden_size: int) -> None:
        super().__init__()
        self.members = members
        self.users = tuple(sorted(users))
        bottleneck = max(method.bottleneck for method in users.values())
        self.down = MemberLinear(members, hidden_size, bottleneck)
        self.up = MemberLinear(members, bottleneck, hidden_size)
        scales = [float(users[m].adapter_scale) if m in users else 0.0 for m in range(members.count)]
        self.register_buffer("scale", torch.tensor(scales).view(-1, 1, 1), persistent=False)

    def selection(self, x: torch.Tensor) -> Selection:
        return self.members.select(self.users, x.device)

    def forward(self, x: torch.Tensor, selection: Selection) -> torch.Tensor:
        """x: the rows of the selected members (those with a parallel adapter)."""
        grouped = x.reshape(selection.count, -1, x.shape[-1])
        out = self.up.grouped(torch.relu(self.down.grouped(grouped, selection)), selection)
        return scale_grouped(out, self.members.slots_of(self.scale, selection)).view(x.shape)

    def init_member(self, slot: int, method: DictConfig) -> None:
        draw(self.down.weight[slot, : method.bottleneck], kaiming)  # bias, Up: zeros (already)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    for layer in model.layers:
        adapter = ParallelAdapter(model.members, users, model.hidden_size)
        ffn_output(model, layer).parallel_adapter = adapter
        mark(model, adapter, users)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for layer in model.layers:
        ffn_output(model, layer).parallel_adapter.init_member(slot, method)
