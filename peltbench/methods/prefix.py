"""Prefix-tuning (Li & Liang 2021; UniPELT Eq. 2), MLP-reparameterised, optionally gated (§3.2).

    P = Embedding(L, H);   P' = Linear(512 → 2·layers·H)(tanh(Linear(H → 512)(P)))
One MLP shared by all layers; P' is cut into a key prefix and a value prefix per layer and head, which are
prepended to that layer's keys and values. Every token may attend to them; attention dropout applies as
usual. Gated: g = mean_t sigmoid(Linear(h_in,t)) from the attention input multiplies both prefixes.
Only the final L × 2 × layers × H tensor is needed after training, so that is what is counted.

In a group, members with shorter prefixes than the group's longest, and members without a prefix (L = 0),
have the rest masked: no token attends to it. The prefixes reach attention through transformers' public
extension point: a registered attention function (`AttentionInterface`) that receives them as a keyword
argument, which `BertSelfAttention` passes through untouched.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .base import Coefficient, MemberLinear, Members, PeltModel, bert_normal, draw, mark

ATTENTION_NAME = "peltbench_prefix_sdpa"


def prefix_attention(module, query, key, value, attention_mask, prefix=None, **kwargs):
    """PyTorch SDPA attention with `prefix = (key_prefix, value_prefix, visible)` prepended to the keys and
    values: prefixes (rows, heads, L, head_dim), visible (rows, L) bool or None when every row sees all L."""
    if prefix is not None:
        key_prefix, value_prefix, visible = prefix
        key = torch.cat([key_prefix.to(key.dtype), key], dim=2)
        value = torch.cat([value_prefix.to(value.dtype), value], dim=2)
        if attention_mask is not None or visible is not None:
            rows, queries, length = query.shape[0], query.shape[2], key_prefix.shape[2]
            if attention_mask is None:
                attention_mask = torch.ones(rows, 1, queries, key.shape[2] - length, dtype=torch.bool, device=query.device)
            shape = (*attention_mask.shape[:-1], length)
            if visible is None:
                seen = torch.ones(shape, dtype=torch.bool, device=query.device)
            else:
                seen = visible[:, None, None, :].expand(rows, 1, shape[2], length)
            if attention_mask.dtype != torch.bool:  # an additive float mask: 0 where visible
                seen = torch.zeros(shape, dtype=attention_mask.dtype, device=query.device).masked_fill(
                    ~seen, torch.finfo(attention_mask.dtype).min)
            attention_mask = torch.cat([seen.expand(shape), attention_mask], dim=-1)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(ATTENTION_NAME, prefix_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # same boolean masks as "sdpa"


class PrefixEncoder(nn.Module):
    """Each member's P = Embedding(L, H) and its MLP; forward gives every active member's prefixes at once."""

    def __init__(self, members: Members, users: dict[int, DictConfig], hidden_size: int, layers: int, heads: int) -> None:
        super().__init__()
        self.members = members
        length = max(method.prefix_length for method in users.values())
        width = max(method.prefix_hidden for method in users.values())
        self.embedding = nn.Parameter(torch.zeros(members.count, length, hidden_size))
        self.down = MemberLinear(members, hidden_size, width)
        self.up = MemberLinear(members, width, 2 * layers * hidden_size)
        self.length, self.hidden_size, self.layers, self.heads = length, hidden_size, layers, heads
        lengths = [users[m].prefix_length if m in users else 0 for m in range(members.count)]
        self.member_lengths = lengths
        self.register_buffer("lengths", torch.tensor(lengths), persistent=False)

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Key/value prefixes (active members, L, layers, 2, heads, head_dim), and which of the L each member sees."""
        hidden = torch.tanh(self.down(self.members.pick(self.embedding)))
        key_values = self.up(hidden).view(hidden.shape[0], self.length, self.layers, 2, self.heads, -1)
        lengths = self.members.pick(self.lengths)
        visible = None
        if bool((lengths < self.length).any()):
            visible = torch.arange(self.length, device=lengths.device)[None, :] < lengths[:, None]
        return key_values, visible

    def init_member(self, slot: int, method: DictConfig) -> None:
        length, width = method.prefix_length, method.prefix_hidden
        draw(self.embedding[slot, :length], bert_normal)
        self.down.init_bert(slot, width, self.hidden_size)
        self.up.init_bert(slot, 2 * self.layers * self.hidden_size, width)

    def stored_numel(self, slot: int) -> int:
        """What must be stored per task: the member's L × 2 × layers × H prefix tensor (the MLP is discarded)."""
        return self.member_lengths[slot] * 2 * self.layers * self.hidden_size


class PrefixSelfAttention(nn.Module):
    """Wraps a `BertSelfAttention` and hands it this layer's (gated) prefix for every row."""

    def __init__(self, inner: nn.Module, members: Members, coefficient: Coefficient, layer: int) -> None:
        super().__init__()
        self.inner = inner
        self.members = members
        self.coefficient = coefficient
        self.layer = layer

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        key_values, visible = self.members.prefixes
        active, rows = self.members.active_count, hidden_states.shape[0] // self.members.active_count
        layer = key_values[:, :, self.layer].permute(2, 0, 3, 1, 4)  # (2, active, heads, L, head_dim)
        layer = layer[:, :, None].expand(-1, -1, rows, -1, -1, -1).reshape(2, active * rows, *layer.shape[2:])
        coefficient = self.coefficient(hidden_states)
        if coefficient is not None:
            layer = layer * coefficient.reshape(1, -1, 1, 1, 1).to(layer.dtype)
        if visible is not None:
            visible = visible[:, None].expand(-1, rows, -1).reshape(active * rows, -1)
        return self.inner(hidden_states, *args, prefix=(layer[0], layer[1], visible), **kwargs)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    config = model.config
    encoder = PrefixEncoder(model.members, users, config.hidden_size, config.num_hidden_layers, config.num_attention_heads)
    model.prefix_encoder = encoder
    mark(model, encoder, users)
    gated = [bool(users[m].gated) if m in users else False for m in range(model.members.count)]
    for index, layer in enumerate(model.layers):
        coefficient = Coefficient(model.members, config.hidden_size, "prefix", index, gated, [1.0] * model.members.count)
        layer.attention.self = PrefixSelfAttention(layer.attention.self, model.members, coefficient, index)
        mark(model, coefficient.gate_parameters(), [m for m, g in enumerate(gated) if g])
    model.backbone.set_attn_implementation(ATTENTION_NAME)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """P and its MLP, then the gates layer by layer: the order a separate run draws them in."""
    model.prefix_encoder.init_member(slot, method)
    for layer in model.layers:
        layer.attention.self.coefficient.init_member(slot)
