"""Prefix-tuning (Li & Liang 2021; UniPELT Eq. 2), MLP-reparameterised, optionally gated (§3.2).

    P = Embedding(L, H);   P' = Linear(512 → 2·layers·H)(tanh(Linear(H → 512)(P)))
One MLP shared by all layers; P' is cut into a key prefix and a value prefix per layer and head, which are
prepended to that layer's keys and values. Every token may attend to them; attention dropout applies as
usual. Gated: g = mean_t sigmoid(Linear(h_in,t)) from the attention input multiplies both prefixes.
Only the final L × 2 × layers × H tensor is needed after training, so that is what is counted.

In a group, the members are attended in classes of equal prefix length (L = 0 for members without one), each
class with exactly its own prefixes, so no row attends to another member's or to padding. The prefixes reach
attention through transformers' public extension point: a registered attention function (`AttentionInterface`)
that receives them as a keyword argument, which `BertSelfAttention` passes through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .base import Coefficient, MemberLinear, Members, PeltModel, Selection, bert_normal, draw, mark

ATTENTION_NAME = "peltbench_prefix_sdpa"


def prefix_attention(module, query, key, value, attention_mask, prefix=None, **kwargs):
    """PyTorch SDPA attention with the rows' prefix keys and values prepended.

    `prefix = (key_values, gate, classes, members)`: key_values (2, members with a prefix, heads, L, head_dim),
    gate (those members, rows per member) or None, and the classes of members by prefix length: (length, which
    members with a prefix, their positions among the `members` blocks of rows); length 0 is the members without
    one. Each class is attended apart with exactly its own prefix length, so no row sees padding.
    """
    if prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    key_values, gate, classes, members = prefix
    outputs, order = [], []
    for length, users, positions in classes:
        def rows(tensor):
            if tensor is None or len(classes) == 1:
                return tensor
            blocks = tensor.view(members, -1, *tensor.shape[1:])
            if isinstance(positions, slice):  # consecutive members: a view
                return blocks[positions].flatten(0, 1)
            return blocks.index_select(0, positions).flatten(0, 1)
        q, k, v, mask = rows(query), rows(key), rows(value), rows(attention_mask)
        if length:
            k, v, mask = _prepend(key_values, gate, users, length, k, v, mask)
        out, _ = sdpa_attention_forward(module, q, k, v, mask, **kwargs)
        outputs.append(out.view(members if len(classes) == 1 else -1, key.shape[0] // members, *out.shape[1:]))
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


def _prepend(key_values, gate, users, length, key, value, mask):
    """The class's keys and values with its members' (gated) prefixes in front, and the mask widened to see them."""
    prefixes = key_values if users is None else key_values.index_select(1, users)
    prefixes = prefixes[:, :, None, :, :length]  # (2, members, 1, heads, L, head_dim)
    count, rows = prefixes.shape[1], key.shape[0] // prefixes.shape[1]
    if gate is not None:
        gate = gate if users is None else gate.index_select(0, users)
        prefixes = prefixes * gate[None, :, :, None, None, None].to(prefixes.dtype)
    else:
        prefixes = prefixes.expand(-1, -1, rows, -1, -1, -1)
    key = torch.cat([prefixes[0].to(key.dtype), key.view(count, rows, *key.shape[1:])], dim=3).flatten(0, 1)
    value = torch.cat([prefixes[1].to(value.dtype), value.view(count, rows, *value.shape[1:])], dim=3).flatten(0, 1)
    if mask is not None:  # every token sees the prefix
        shape = (*mask.shape[:-1], length)
        seen = torch.ones(shape, dtype=torch.bool, device=mask.device) if mask.dtype == torch.bool else \
            torch.zeros(shape, dtype=mask.dtype, device=mask.device)
        mask = torch.cat([seen, mask], dim=-1)
    return key, value, mask


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
        self._class_cache: dict = {}

    def forward(self) -> Prefixes | None:
        """The active members' prefixes, computed once per batch for every layer (None: no active member has one)."""
        selection = self.members.select(self.users, self.embedding.device)
        if not selection.count:
            return None
        hidden = torch.tanh(self.down(self.members.slots_of(self.embedding, selection), selection))
        key_values = self.up(hidden, selection).view(selection.count, self.length, self.layers, 2, self.heads, -1)
        return Prefixes(selection, key_values, self._classes(selection))

    def _classes(self, selection: Selection) -> list:
        """The active members by prefix length: (length, which of the selection, positions among the active members);
        length 0: the members without a prefix. Once per set of active members."""
        key = (tuple(self.members.active_slots()), "prefix classes")
        if key not in self._class_cache:
            active = self.members.active_slots()
            users = [slot for slot in active if slot in self.users]
            device = self.embedding.device
            classes = []
            for length in sorted({self.member_lengths[slot] for slot in active}):
                slots = [slot for slot in active if self.member_lengths[slot] == length]
                which = None if length == 0 or len(slots) == len(users) else \
                    torch.tensor([users.index(slot) for slot in slots], device=device)
                positions = [active.index(slot) for slot in slots]
                if positions == list(range(positions[0], positions[-1] + 1)):
                    classes.append((length, which, slice(positions[0], positions[-1] + 1)))
                else:
                    classes.append((length, which, torch.tensor(positions, device=device)))
            self._class_cache = {key: classes}
        return self._class_cache[key]

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
        prefixes = self.members.prefixes
        if prefixes is None:  # no active member has a prefix
            return self.inner(hidden_states, *args, **kwargs)
        selection = prefixes.selection
        key_values = prefixes.key_values[:, :, self.layer].permute(2, 0, 3, 1, 4)  # (2, members, heads, L, head_dim)
        gate = self.coefficient(self.members.gather(selection, hidden_states), selection)
        prefix = (key_values, gate, prefixes.classes, self.members.active_count)
        return self.inner(hidden_states, *args, prefix=prefix, **kwargs)


@dataclass
class Prefixes:
    """One batch's prefixes: the members with one (`selection`), their key/value prefixes (members, L, layers, 2,
    heads, head_dim), and the active members by prefix length (PrefixEncoder._classes)."""

    selection: Selection
    key_values: torch.Tensor
    classes: list


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
