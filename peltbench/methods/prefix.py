"""Prefix-tuning (Li & Liang 2021; UniPELT Eq. 2), MLP-reparameterised, optionally gated (§3.2).

    P = Embedding(L, H);   P' = Linear(512 → 2·layers·H)(tanh(Linear(H → 512)(P)))
One MLP shared by all layers; P' is cut into a key prefix and a value prefix per layer and head, which are
prepended to that layer's keys and values. Every token may attend to them; attention dropout applies as
usual. Gated: g = mean_t sigmoid(Linear(h_in,t)) from the attention input multiplies both prefixes.
Only the final L × 2 × layers × H tensor is needed after training, so that is what is counted.

The prefixes reach attention through transformers' public extension point: a registered attention
function (`AttentionInterface`) that receives them as a keyword argument, which `BertSelfAttention`
passes through untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .base import INIT_STD, Gate, PeltModel, maybe_gate, new_linear

ATTENTION_NAME = "peltbench_prefix_sdpa"


def prefix_attention(module, query, key, value, attention_mask, prefix=None, **kwargs):
    """PyTorch SDPA attention with `prefix = (key_prefix, value_prefix)`, each (batch, heads, L, head_dim),
    prepended to the keys and values; the mask is widened so every token sees the prefix."""
    if prefix is not None:
        key_prefix, value_prefix = prefix
        key = torch.cat([key_prefix.to(key.dtype), key], dim=2)
        value = torch.cat([value_prefix.to(value.dtype), value], dim=2)
        if attention_mask is not None:
            shape = (*attention_mask.shape[:-1], key_prefix.shape[2])
            visible = attention_mask.new_ones(shape) if attention_mask.dtype == torch.bool else attention_mask.new_zeros(shape)
            attention_mask = torch.cat([visible, attention_mask], dim=-1)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(ATTENTION_NAME, prefix_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # same boolean masks as "sdpa"


class PrefixEncoder(nn.Module):
    def __init__(self, length: int, hidden_size: int, mlp_hidden: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(length, hidden_size)
        nn.init.normal_(self.embedding.weight, std=INIT_STD)
        self.down = new_linear(hidden_size, mlp_hidden)
        self.up = new_linear(mlp_hidden, 2 * layers * hidden_size)
        self.length, self.hidden_size, self.layers, self.heads = length, hidden_size, layers, heads

    def layer_prefix(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value prefix of one layer, each (heads, L, head_dim); only that layer's rows of Up are computed."""
        hidden = torch.tanh(self.down(self.embedding.weight))
        rows = slice(2 * layer * self.hidden_size, 2 * (layer + 1) * self.hidden_size)
        key_value = F.linear(hidden, self.up.weight[rows], self.up.bias[rows])
        key_value = key_value.view(self.length, 2, self.heads, -1).permute(1, 2, 0, 3)
        return key_value[0], key_value[1]

    def stored_numel(self) -> int:
        """What must be stored per task: the L × 2 × layers × H prefix tensor (the MLP is discarded)."""
        return self.length * 2 * self.layers * self.hidden_size


class PrefixSelfAttention(nn.Module):
    """Wraps a `BertSelfAttention` and hands it this layer's (gated) prefix."""

    def __init__(self, inner: nn.Module, encoder: PrefixEncoder, layer: int, gate: Gate | None) -> None:
        super().__init__()
        self.inner = inner
        self.gate = gate
        self.layer = layer
        self._encoder = [encoder]  # a reference, not a submodule: the encoder is registered once, on the model

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        key, value = self._encoder[0].layer_prefix(self.layer)
        batch = hidden_states.shape[0]
        key = key.unsqueeze(0).expand(batch, -1, -1, -1)
        value = value.unsqueeze(0).expand(batch, -1, -1, -1)
        if self.gate is not None:
            gate = self.gate(hidden_states)[:, None, None, None]
            key, value = gate * key, gate * value
        return self.inner(hidden_states, *args, prefix=(key, value), **kwargs)


def attach(model: PeltModel, method: DictConfig) -> list[nn.Parameter]:
    config = model.backbone.config
    encoder = PrefixEncoder(
        method.prefix_length, config.hidden_size, method.prefix_hidden,
        config.num_hidden_layers, config.num_attention_heads,
    )
    model.prefix_encoder = encoder
    trainable = list(encoder.parameters())
    for index, layer in enumerate(model.layers):
        gate = maybe_gate(method.gated, config.hidden_size, model.context, "prefix", index)
        layer.attention.self = PrefixSelfAttention(layer.attention.self, encoder, index, gate)
        trainable += gate.parameters() if gate is not None else []
    model.backbone.set_attn_implementation(ATTENTION_NAME)
    return trainable
