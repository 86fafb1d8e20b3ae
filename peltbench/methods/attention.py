"""Attention as every encoder computes it under peltbench: PyTorch SDPA, with the rows' prefixes and an additive bias.

One function, `attention`, serves every architecture. BERT, RoBERTa, ELECTRA and ModernBERT reach it through
transformers' attention interface (registered under ATTENTION_NAME; their attention modules pass `prefix=` through
untouched). DeBERTa's disentangled attention does not use that interface, so `RelativeSelfAttention` computes it
(the same arithmetic as transformers' `DisentangledSelfAttention`) and hands its relative-position scores to
`attention` as a bias.

A prefix (prefix-tuning, UniPELT Eq. 2) is L keys and values prepended to a layer's own; every token may attend to
them. In a group, members are attended in classes of equal prefix length (L = 0 for members without one), each class
with exactly its own prefixes, so no row attends to another member's prefix or to padding. Prefix positions have no
position: no RoPE (ModernBERT rotates only the tokens' keys), no relative bias (DeBERTa: zero over the prefix
columns, as AdapterHub pads it), and no position id is shifted (RoBERTa's start after its padding index as usual).
"""

from __future__ import annotations

import math
from types import MethodType

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

ATTENTION_NAME = "peltbench_sdpa"


def attention(module, query, key, value, attention_mask, prefix=None, position_bias=None, dropout=0.0, **kwargs):
    """SDPA attention (query, key, value: (rows, heads, tokens, head_dim)) with the rows' prefixes prepended.

    `prefix = (key_values, gate, classes, members)`: key_values (2, members with a prefix, heads, L, head_dim), gate
    (those members, rows per member, 1) or None, and the classes of members by prefix length: (length, which members
    with a prefix, their positions among the `members` blocks of rows); see PrefixEncoder. `position_bias`: scores added
    before the softmax (rows, heads, tokens, tokens): DeBERTa's relative attention. With dropout (training), the
    probabilities are computed here and each member's own masks applied (methods/randomness.py); otherwise SDPA.
    """
    own_masks = dropout > 0 and hasattr(module, "peltbench_site")
    if prefix is None:
        if own_masks:
            return _attend_with_member_dropout(module, query, key, value, attention_mask, position_bias, dropout,
                                               None, **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, position_bias=position_bias,
                                      dropout=dropout, **kwargs)
    key_values, gate, classes, members = prefix
    per_member = query.shape[0] // members
    outputs, order = [], []
    for length, users, positions in classes:
        def rows(tensor):
            if tensor is None or len(classes) == 1 or tensor.shape[0] == 1:
                return tensor
            blocks = tensor.view(members, -1, *tensor.shape[1:])
            if isinstance(positions, slice):  # consecutive members: a view
                return blocks[positions].flatten(0, 1)
            return blocks.index_select(0, positions).flatten(0, 1)
        q, k, v, mask, bias = rows(query), rows(key), rows(value), rows(attention_mask), rows(position_bias)
        if length:
            k, v, mask, bias = _prepend(key_values, gate, users, length, k, v, mask, bias)
        if own_masks:
            out, _ = _attend_with_member_dropout(module, q, k, v, mask, bias, dropout,
                                                 None if len(classes) == 1 else _rows(positions, per_member, q.device),
                                                 **kwargs)
        else:
            out, _ = sdpa_attention_forward(module, q, k, v, mask, position_bias=bias, dropout=dropout, **kwargs)
        outputs.append(out.view(members if len(classes) == 1 else -1, per_member, *out.shape[1:]))
        order.append(positions)
    if len(classes) == 1:
        return outputs[0].flatten(0, 1), None
    if all(isinstance(p, slice) for p in order) and [p.start for p in order] == sorted(p.start for p in order):
        return torch.cat(outputs).flatten(0, 1), None  # the classes lie in the rows' own order
    back = torch.argsort(torch.cat([_indices(p, query.device) for p in order]))  # the rows' own order
    return torch.cat(outputs).index_select(0, back).flatten(0, 1), None


def _indices(positions, device) -> torch.Tensor:
    if isinstance(positions, slice):
        return torch.arange(positions.start, positions.stop, device=device)
    return positions


def _rows(positions, per_member: int, device) -> slice | torch.Tensor:
    """The rows of the members at `positions` (a slice or a tensor of member positions)."""
    if isinstance(positions, slice):
        return slice(positions.start * per_member, positions.stop * per_member)
    return (positions[:, None] * per_member + torch.arange(per_member, device=device)).flatten()


def _attend_with_member_dropout(module, query, key, value, mask, bias, dropout, rows, scaling=None, **kwargs):
    """softmax(q kᵀ · scaling + bias, masked) with each member's own dropout mask, times v; (rows, tokens, heads, d)."""
    from .randomness import attention_keep_mask, drop

    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    probabilities = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    keep = attention_keep_mask(module, query.shape[1], query.shape[2], key.shape[2], dropout, query.device, rows)
    out = torch.matmul(drop(probabilities, keep, dropout), value)
    return out.transpose(1, 2).contiguous(), None


def _prepend(key_values, gate, users, length, key, value, mask, bias):
    """The class's keys and values with its members' (gated) prefixes in front; the mask widened to see them, the
    bias widened with zeros over them."""
    prefixes = key_values if users is None else key_values.index_select(1, users)
    prefixes = prefixes[:, :, None, :, :length]  # (2, members, 1, heads, L, head_dim)
    count, rows = prefixes.shape[1], key.shape[0] // prefixes.shape[1]
    if gate is not None:
        gate = gate if users is None else gate.index_select(0, users)
        prefixes = prefixes * gate.view(1, *gate.shape[:2], 1, 1, 1).to(prefixes.dtype)
    else:
        prefixes = prefixes.expand(-1, -1, rows, -1, -1, -1)
    key = torch.cat([prefixes[0].to(key.dtype), key.view(count, rows, *key.shape[1:])], dim=3).flatten(0, 1)
    value = torch.cat([prefixes[1].to(value.dtype), value.view(count, rows, *value.shape[1:])], dim=3).flatten(0, 1)
    if mask is not None:  # every token sees the prefix
        shape = (*mask.shape[:-1], length)
        seen = torch.ones(shape, dtype=torch.bool, device=mask.device) if mask.dtype == torch.bool else \
            torch.zeros(shape, dtype=mask.dtype, device=mask.device)
        mask = torch.cat([seen, mask], dim=-1)
    if bias is not None:  # no relative position to the prefix
        bias = torch.cat([bias.new_zeros((*bias.shape[:-1], length)), bias], dim=-1)
    return key, value, mask, bias


AttentionInterface.register(ATTENTION_NAME, attention)
def _mask(*args, allow_is_bidirectional_skip: bool = False, **kwargs):
    """The boolean masks of "sdpa". In a training step (gradients on) the mask is always made, on the device: the
    shortcut that returns None for a batch without padding asks the device whether any row is padded (a host
    synchronisation per forward pass), and training attends through its own masked softmax anyway (dropout)."""
    skip = allow_is_bidirectional_skip and not torch.is_grad_enabled()
    return sdpa_mask(*args, allow_is_bidirectional_skip=skip, **kwargs)


AttentionMaskInterface.register(ATTENTION_NAME, _mask)


class RelativeSelfAttention(nn.Module):
    """DeBERTa's disentangled self-attention (He et al. 2021, Eq. 4), computed by peltbench, wrapping transformers'
    `DisentangledSelfAttention` (its projections and settings are used as they are).

    score(i, j) = (q_i·k_j + q_i·k^r_δ(i,j) + k_j·q^r_δ(j,i)) / sqrt(3d)   (content, content→position, position→content)
    The relative terms are the `position_bias` of `attention`. The relative embeddings come per member (the encoder's
    `get_rel_embedding`, replaced by `member_relative_embeddings`): a member's LoRA or BitFit on the query/key
    projections and its LN-tuning of the relative embeddings' LayerNorm reach its positional keys and queries too, as
    they do in a model of its own. Padding is masked on the key side only (transformers also masks padded queries,
    whose outputs no real token reads).
    """

    def __init__(self, inner: nn.Module, members) -> None:
        super().__init__()
        self.inner = inner
        self.members = members

    def forward(self, hidden_states, attention_mask, output_attentions=False, query_states=None, relative_pos=None,
                rel_embeddings=None, prefix=None):
        inner = self.inner
        if query_states is None:
            query_states = hidden_states
        query = self._heads(inner.query_proj(query_states))
        key = self._heads(inner.key_proj(hidden_states))
        value = self._heads(inner.value_proj(hidden_states))
        factor = 1 + ("c2p" in inner.pos_att_type) + ("p2c" in inner.pos_att_type)
        scale = math.sqrt(query.shape[-1] * factor)
        bias = None
        if inner.relative_attention:
            with self.members.positional():
                rel_embeddings = inner.pos_dropout(rel_embeddings)
            bias = self._relative_bias(query, key, relative_pos, rel_embeddings, scale)
        mask = self.members.token_mask
        mask = None if mask is None else mask[:, None, None, :].bool()
        out, _ = attention(inner, query, key, value, mask, prefix=prefix, position_bias=bias, is_causal=False,
                           dropout=inner.dropout.p if self.training else 0.0, scaling=1.0 / scale)
        return out.reshape(*out.shape[:2], -1), None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, tokens, heads · d) → (rows, heads, tokens, d)"""
        return x.view(*x.shape[:2], self.inner.num_attention_heads, -1).transpose(1, 2)

    def _relative_bias(self, query, key, relative_pos, rel_embeddings, scale):
        """The content→position and position→content scores, (rows, heads, tokens, tokens), each member with its own
        positional keys and queries (rel_embeddings: (members, 2·span, hidden), one block per active member)."""
        inner = self.inner
        members, span = rel_embeddings.shape[0], inner.pos_ebd_size
        rel = rel_embeddings[:, : 2 * span]
        if relative_pos is None:
            relative_pos = build_relative_position(query, key, bucket_size=inner.position_buckets,
                                                   max_position=inner.max_relative_positions)
        relative_pos = relative_pos.reshape(relative_pos.shape[-2:]).to(device=query.device, dtype=torch.long)
        rows, heads, tokens, _ = query.shape
        shape = (members, rows // members, heads, tokens, -1)
        score = 0
        with self.members.positional():
            if "c2p" in inner.pos_att_type:
                positional_key = self._heads(inner.key_proj(rel) if inner.share_att_key else inner.pos_key_proj(rel))
                c2p = query.view(shape) @ positional_key[:, None].transpose(-1, -2)  # (members, rows, heads, i, 2·span)
                index = torch.clamp(relative_pos + span, 0, 2 * span - 1)
                score = score + torch.gather(c2p, -1, index.expand(c2p.shape[:-1] + (tokens,))) / scale
            if "p2c" in inner.pos_att_type:
                positional_query = self._heads(inner.query_proj(rel) if inner.share_att_key else inner.pos_query_proj(rel))
                p2c = key.view(shape) @ positional_query[:, None].transpose(-1, -2)  # (members, rows, heads, j, 2·span)
                index = torch.clamp(-relative_pos + span, 0, 2 * span - 1)
                score = score + torch.gather(p2c, -1, index.expand(p2c.shape[:-1] + (tokens,))).transpose(-1, -2) / scale
        return score.view(rows, heads, tokens, tokens)


def member_relative_embeddings(encoder, members) -> torch.Tensor:
    """DeBERTa's relative embeddings (normalised as the encoder does), one block per active member: (members, 2·span, H)."""
    rel = encoder.rel_embeddings.weight.unsqueeze(0).expand(members.active_count, -1, -1)
    if "layer_norm" in encoder.norm_rel_ebd:
        with members.positional():
            rel = encoder.LayerNorm(rel)
    return rel


def install_relative_attention(encoder, layers, attention_path: str, members) -> None:
    """Compute DeBERTa's attention with `RelativeSelfAttention` in every layer, from per-member relative embeddings."""
    from ..architectures import get, put

    for layer in layers:
        put(layer, attention_path, RelativeSelfAttention(get(layer, attention_path), members))
    if getattr(encoder, "relative_attention", False):
        encoder.get_rel_embedding = MethodType(lambda self: member_relative_embeddings(self, members), encoder)
