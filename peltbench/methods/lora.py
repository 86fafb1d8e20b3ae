"""LoRA (Hu et al. 2021; UniPELT Eq. 3), on the query and value projections by default.

    y = W x + s · B(A x)
A: H → r, kaiming-uniform (a = √5); B: r → H, zeros; no dropout. Ungated, s is the constant
`lora_scale` (the paper's α = 2). Gated (UniPELT), each adapted projection gets its own gate from its
input, and the gate replaces s (official code; METHODS.md).
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn

from .base import Coefficient, MemberLinear, Members, PeltModel, draw, mark, scale_rows, self_attention

TARGETS = ("query", "key", "value")  # projections of BertSelfAttention that LoRA may adapt


def kaiming(tensor: torch.Tensor) -> torch.Tensor:
    return nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))


class LoRALinear(nn.Module):
    """Wraps one projection W of `BertSelfAttention`. Members with a smaller rank than the group's largest hold
    zeros in the rest of A and B, and members without LoRA on this projection hold zeros everywhere."""

    def __init__(self, base: nn.Module, members: Members, users: dict[int, DictConfig], submodule: str, layer: int) -> None:
        super().__init__()
        self.base = base
        self.members = members
        self.users = tuple(sorted(users))
        in_features, out_features = base.weight.shape[1], base.weight.shape[0]
        rank = max(method.lora_rank for method in users.values())
        self.lora_a = MemberLinear(members, in_features, rank, bias=False)
        self.lora_b = MemberLinear(members, rank, out_features, bias=False)
        gated = [bool(users[m].gated) if m in users else False for m in range(members.count)]
        scales = [float(users[m].lora_scale) if m in users else 1.0 for m in range(members.count)]
        self.coefficient = Coefficient(members, in_features, submodule, layer, gated, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        selection = self.members.select(self.users, x.device)
        if not selection.count:
            return out
        rows = self.members.gather(selection, x)  # only the members with LoRA here
        delta = scale_rows(self.lora_b(self.lora_a(rows, selection), selection), self.coefficient(rows, selection))
        return self.members.add_rows(selection, out, delta)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """A kaiming-uniform, B zeros (already), then the gate: the order a separate run draws them in."""
        draw(self.lora_a.weight[slot, : method.lora_rank], kaiming)
        self.coefficient.init_member(slot)


def _targets(users: dict[int, DictConfig]) -> list[str]:
    return [t for t in TARGETS if any(t in method.lora_targets for method in users.values())]


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    for index, layer in enumerate(model.layers):
        attention = self_attention(layer)
        for target in _targets(users):
            on_target = {m: method for m, method in users.items() if target in method.lora_targets}
            lora = LoRALinear(getattr(attention, target), model.members, on_target, f"lora_{target}", index)
            setattr(attention, target, lora)
            mark(model, [*lora.lora_a.parameters(), *lora.lora_b.parameters()], on_target)
            mark(model, lora.coefficient.gate_parameters(), [m for m in on_target if on_target[m].gated])


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for layer in model.layers:
        attention = self_attention(layer)
        for target in TARGETS:
            if target in method.lora_targets:
                getattr(attention, target).init_member(slot, method)


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.lora_targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"lora_targets: unknown projection(s) {unknown}; choose from {list(TARGETS)}")
