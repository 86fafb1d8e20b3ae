"""Scaled parallel FFN adapter, the FFN half of the MAM adapter (He et al. 2022, "Towards a Unified View").

Computed from the FFN's input x (the attention output a) and added before the block's residual and LayerNorm:
    out = LN(dropout(dense(intermediate)) + s · Up(ReLU(Down(a))) + a)
Down is kaiming-uniform (a = √5, PyTorch's Linear default) with zero bias; Up starts at zero, so the
model starts exactly as the pretrained one (METHODS.md).
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn

from .base import PeltModel, plain_ffn_output


class ParallelAdapter(nn.Module):
    def __init__(self, hidden_size: int, bottleneck: int, scale: float) -> None:
        super().__init__()
        self.down = nn.Linear(hidden_size, bottleneck)
        self.up = nn.Linear(bottleneck, hidden_size)
        nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.up(torch.relu(self.down(x)))


class ParallelAdapterOutput(nn.Module):
    """Wraps a `BertOutput`, reusing its dense, dropout and LayerNorm."""

    def __init__(self, output: nn.Module, adapter: ParallelAdapter) -> None:
        super().__init__()
        self.base = output
        self.adapter = adapter

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        h = self.base.dropout(self.base.dense(hidden_states))
        return self.base.LayerNorm(h + self.adapter(input_tensor) + input_tensor)


def attach(model: PeltModel, method: DictConfig) -> list[nn.Parameter]:
    trainable: list[nn.Parameter] = []
    for layer in model.layers:
        adapter = ParallelAdapter(model.hidden_size, method.bottleneck, method.adapter_scale)
        layer.output = ParallelAdapterOutput(plain_ffn_output(layer, "parallel_adapter"), adapter)
        trainable += adapter.parameters()
    return trainable
