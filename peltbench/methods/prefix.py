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

from .base import Coefficient, MemberLinear, Members, PeltModel, Selection, bert_normal, draw, mark

ATTENTION_NAME = "peltbench_prefix_sdpa"


def prefix_attention(module, query, key, value, attention_mask, prefix=None, **kwargs):
    """PyTorch SDPA attention with prefix keys and values prepended for the rows that have them.

    `prefix = (key_prefix, value_prefix, visible, split)`: prefixes (rows with a prefix, heads, L, head_dim);
    visible (those rows, L) bool, or None when every one sees all L; split None when every row has a prefix,
    else (members, positions of those with a prefix, positions of the others) among the rows' member blocks:
    the rows without one are attended on their own, as a separate run would."""
    if prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    key_prefix, value_prefix, visible, split = prefix
    if split is None:
        return _with_prefix(module, query, key, value, attention_mask, key_prefix, value_prefix, visible, **kwargs)
    members, users, others = split
    def rows(tensor, positions):
        return None if tensor is None else tensor.view(members, -1, *tensor.shape[1:]).index_select(0, positions).flatten(0, 1)
    with_prefix, _ = _with_prefix(module, rows(query, users), rows(key, users), rows(value, users),
                                  rows(attention_mask, users), key_prefix, value_prefix, visible, **kwargs)
    blocks = [with_prefix.view(len(users), -1, *with_prefix.shape[1:])]
    if len(others):
        without, _ = sdpa_attention_forward(module, rows(query, others), rows(key, others), rows(value, others),
                                            rows(attention_mask, others), **kwargs)
        blocks.append(without.view(len(others), -1, *without.shape[1:]))
    order = torch.argsort(torch.cat([users, others]))  # back to the rows' own order
    return torch.cat(blocks).index_select(0, order).flatten(0, 1), None


def _with_prefix(module, query, key, value, attention_mask, key_prefix, value_prefix, visible, **kwargs):
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
        attention_mask = torch.cat([seen.expand(shape), attention_mask.expand(*shape[:-1], -1)], dim=-1)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(ATTENTION_NAME, prefix_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # same boolean masks as "sdpa"


class PrefixEncoder(nn.Module):
    """Each member's P = Embedding(L, H) and its MLP; forward gives every active member's prefixes at once."""

    def __init__(self, members: Members, users: dict[int, DictConfig], hidden_size: int, layers: int, heads: int) -> None:
        super().__init__()
        self.members = members
        self.users = tuple(sorted(users))
        length = max(method.prefix_length for method in users.values())
        width = max(method.prefix_hidden for method in users.values())
        self.embedding = nn.Parameter(torch.zeros(members.count, length, hidden_size))
        self.down = MemberLinear(members, hidden_size, width)
        self.up = MemberLinear(members, width, 2 * layers * hidden_size)
        self.length, self.hidden_size, self.layers, self.heads = length, hidden_size, layers, heads
        lengths = [users[m].prefix_length if m in users else 0 for m in range(members.count)]
        self.member_lengths = lengths
        self.register_buffer("lengths", torch.tensor(lengths), persistent=False)

    def forward(self) -> tuple[Selection, torch.Tensor, torch.Tensor | None] | None:
        """For the active members with a prefix: their selection, their key/value prefixes (members, L, layers, 2,
        heads, head_dim), and which of the L each sees (None: all). None when no active member has a prefix."""
        selection = self.members.select(self.users, self.embedding.device)
        if not selection.count:
            return None
        hidden = torch.tanh(self.down(self.members.slots_of(self.embedding, selection), selection))
        key_values = self.up(hidden, selection).view(selection.count, self.length, self.layers, 2, self.heads, -1)
        lengths = [self.member_lengths[slot] for slot in (selection.slots.tolist() if selection.slots is not None
                                                          else range(self.members.count))]
        visible = None
        if min(lengths) < self.length:
            lengths = torch.tensor(lengths, device=key_values.device)
            visible = torch.arange(self.length, device=key_values.device)[None, :] < lengths[:, None]
        return selection, key_values, visible

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
        if self.members.prefixes is None:  # no active member has a prefix
            return self.inner(hidden_states, *args, **kwargs)
        selection, key_values, visible = self.members.prefixes
        users, rows = selection.count, hidden_states.shape[0] // self.members.active_count
        layer = key_values[:, :, self.layer].permute(2, 0, 3, 1, 4)  # (2, users, heads, L, head_dim)
        layer = layer[:, :, None].expand(-1, -1, rows, -1, -1, -1).reshape(2, users * rows, *layer.shape[2:])
        coefficient = self.coefficient(self.members.gather(selection, hidden_states), selection)
        if coefficient is not None:
            layer = layer * coefficient.reshape(1, -1, 1, 1, 1).to(layer.dtype)
        if visible is not None:
            visible = visible[:, None].expand(-1, rows, -1).reshape(users * rows, -1)
        split = None
        if not selection.every:
            others = [i for i in range(self.members.active_count) if i not in set(selection.positions.tolist())]
            split = (self.members.active_count, selection.positions,
                     torch.tensor(others, dtype=torch.long, device=hidden_states.device))
        return self.inner(hidden_states, *args, prefix=(layer[0], layer[1], visible, split), **kwargs)


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
