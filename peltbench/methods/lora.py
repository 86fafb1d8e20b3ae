"""LoRA (Hu et al. 2021; UniPELT Eq. 3), on the query and value projections by default.

    y = W x + s · B(A x)
A: H → r, kaiming-uniform (a = √5); B: r → H, zeros; no dropout. Where the projections are (a row block of
ModernBERT's fused Wqkv) is the architecture map's business (architectures.py). Ungated, s is the constant
`lora_scale` (the paper's α = 2). Gated (UniPELT), each adapted projection gets its own gate from its
input, and the gate replaces s (official code; docs/protocol.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from ..architectures import unwrapped
from .base import Coefficient, MemberLinear, Members, PeltModel, draw, mark, scale_rows

TARGETS = ("query", "key", "value")  # the attention projections LoRA may adapt (where each sits: architectures.py)


def kaiming(tensor: torch.Tensor) -> torch.Tensor:
    return nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))


class LoRALinear(nn.Module):
    """Wraps one projection W (`base`) and adds s · B(A x) to its output. Members with a smaller rank than the group's
    largest hold zeros in the rest of A and B, and members without LoRA on this projection hold zeros everywhere.

    Inside a fused projection (ModernBERT's Wqkv, `FusedLoRA`) it has no `base` and adds to its own row `block` of
    the fused output: LoRA on q and v of Wqkv is then exactly LoRA on separate q and v projections."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None = None) -> None:
        super().__init__()
        self.base = base
        self.block = block
        self.members = members
        self.users = tuple(sorted(users))
        rank = max(method.lora_rank for method in users.values())
        self.lora_a = MemberLinear(members, in_features, rank, bias=False)
        self.lora_b = MemberLinear(members, rank, out_features, bias=False)
        gated = [bool(users[m].gated) if m in users else False for m in range(members.count)]
        scales = [float(users[m].lora_scale) if m in users else 1.0 for m in range(members.count)]
        self.coefficient = Coefficient(members, in_features, submodule, layer, gated, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, self.base(x))

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out (the projection's output for x) plus this LoRA's delta, on the rows of the members that have it."""
        selection = self.members.select(self.users, x.device)
        if not selection.count:
            return out
        rows = self.members.gather(selection, x)  # only the members with LoRA here
        delta = scale_rows(self.lora_b(self.lora_a(rows, selection), selection), self.coefficient(rows, selection))
        if self.block is not None:  # its rows of a fused projection's output, zeros elsewhere
            delta = F.pad(delta, (self.block.start, out.shape[-1] - self.block.stop))
        return self.members.add_rows(selection, out, delta)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """A kaiming-uniform, B zeros (already), then the gate: the order a separate run draws them in."""
        draw(self.lora_a.weight[slot, : method.lora_rank], kaiming)
        self.coefficient.init_member(slot)


class FusedLoRA(nn.Module):
    """A fused projection (ModernBERT's Wqkv = [W_q; W_k; W_v]) with LoRA on some of its blocks: the fused output is
    computed once, and each block's LoRA (a LoRALinear named after its target) adds to its own rows."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.targets: list[str] = []  # each its LoRALinear, registered under the target's name (query, value ...)

    def add_target(self, target: str, lora: LoRALinear) -> None:
        self.add_module(target, lora)
        self.targets.append(target)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        for target in self.targets:
            out = getattr(self, target).add(x, out)
        return out


def lora_module(model: PeltModel, layer: nn.Module, target: str) -> LoRALinear:
    """The LoRALinear on `target` (query, key or value) of a layer."""
    name, block = model.arch.projections[target]
    module = unwrapped(getattr(model.attention(layer), name))  # under a later wrapper ((IA)³'s scale)
    return module if block is None else getattr(module, target)


def _targets(users: dict[int, DictConfig]) -> list[str]:
    return [t for t in TARGETS if any(t in method.lora_targets for method in users.values())]


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    for index, layer in enumerate(model.layers):
        attention = model.attention(layer)
        for target in _targets(users):
            on_target = {m: method for m, method in users.items() if target in method.lora_targets}
            name, block = model.arch.projections[target]
            projection = getattr(attention, name)
            if block is None:
                out_features, in_features = projection.weight.shape
                lora = LoRALinear(projection, model.members, on_target, f"lora_{target}", index, in_features,
                                  out_features)
                setattr(attention, name, lora)
            else:
                if not isinstance(projection, FusedLoRA):
                    projection = FusedLoRA(projection)
                    setattr(attention, name, projection)
                out_features, in_features = projection.base.weight.shape
                size = out_features // len(TARGETS)
                lora = LoRALinear(None, model.members, on_target, f"lora_{target}", index, in_features, size,
                                  slice(block * size, (block + 1) * size))
                projection.add_target(target, lora)
            mark(model, [*lora.lora_a.parameters(), *lora.lora_b.parameters()], on_target)
            mark(model, lora.coefficient.gate_parameters(), [m for m in on_target if on_target[m].gated])


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for layer in model.layers:
        for target in TARGETS:
            if target in method.lora_targets:
                lora_module(model, layer, target).init_member(slot, method)


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.lora_targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"lora_targets: unknown projection(s) {unknown}; choose from {list(TARGETS)}")
