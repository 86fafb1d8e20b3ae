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

from .base import ForwardContext, PeltModel, maybe_gate, self_attention

TARGETS = ("query", "key", "value")  # projections of BertSelfAttention that LoRA may adapt


class LoRALinear(nn.Module):
    """Wraps one projection W of `BertSelfAttention`; the gate (if any) is built after A and B, so gated and
    ungated LoRA start from the same A."""

    def __init__(self, base: nn.Linear, rank: int, scale: float, gated: bool, context: ForwardContext,
                 submodule: str, layer: int) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)
        self.scale = scale
        self.gate = maybe_gate(gated, base.in_features, context, submodule, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        delta = self.lora_b(self.lora_a(x))
        if self.gate is None:
            delta = self.scale * delta
        else:
            delta = self.gate(x)[:, None, None].to(delta.dtype) * delta
        return self.base(x) + delta


def attach(model: PeltModel, method: DictConfig) -> list[nn.Parameter]:
    unknown = sorted(set(method.lora_targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"lora_targets: unknown projection(s) {unknown}; choose from {list(TARGETS)}")
    trainable: list[nn.Parameter] = []
    for index, layer in enumerate(model.layers):
        attention = self_attention(layer)
        for target in method.lora_targets:
            lora = LoRALinear(getattr(attention, target), method.lora_rank, method.lora_scale, method.gated,
                              model.context, f"lora_{target}", index)
            setattr(attention, target, lora)
            trainable += [p for name, p in lora.named_parameters() if not name.startswith("base.")]
    return trainable
