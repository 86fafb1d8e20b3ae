"""Adapter, Pfeiffer placement after the FFN (UniPELT Eq. 1; gated as in §3.2).

In BERT's output block, with h = dropout(dense(intermediate)) and a the attention output (the block's
residual input), and LN the block's own pretrained LayerNorm (used twice, frozen):
    x = LN(h + a);   out = LN(h + g · Up(ReLU(Down(x))) + a)
g = 1 ungated; gated, g = mean_t sigmoid(Linear(x_t)).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from .base import ForwardContext, PeltModel, maybe_gate, new_linear, plain_ffn_output


class Adapter(nn.Module):
    """Down (H → bottleneck), ReLU, Up (bottleneck → H), both with bias; optionally gated."""

    def __init__(self, hidden_size: int, bottleneck: int, gated: bool, context: ForwardContext, layer: int) -> None:
        super().__init__()
        self.down = new_linear(hidden_size, bottleneck)
        self.up = new_linear(bottleneck, hidden_size)
        self.gate = maybe_gate(gated, hidden_size, context, "adapter", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.up(torch.relu(self.down(x)))
        if self.gate is not None:
            out = self.gate(x)[:, None, None].to(out.dtype) * out
        return out


class AdapterOutput(nn.Module):
    """Wraps a `BertOutput`, reusing its dense, dropout and LayerNorm, and inserts the adapter."""

    def __init__(self, output: nn.Module, adapter: Adapter) -> None:
        super().__init__()
        self.base = output
        self.adapter = adapter

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        h = self.base.dropout(self.base.dense(hidden_states))
        x = self.base.LayerNorm(h + input_tensor)
        return self.base.LayerNorm(h + self.adapter(x) + input_tensor)


def attach(model: PeltModel, method: DictConfig) -> list[nn.Parameter]:
    trainable: list[nn.Parameter] = []
    for index, layer in enumerate(model.layers):
        adapter = Adapter(model.hidden_size, method.bottleneck, method.gated, model.context, index)
        layer.output = AdapterOutput(plain_ffn_output(layer, "adapter"), adapter)
        trainable += adapter.parameters()
    return trainable
