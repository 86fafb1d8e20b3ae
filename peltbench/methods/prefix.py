"""Prefix-tuning (Li & Liang 2021; UniPELT Eq. 2), MLP-reparameterised, optionally gated (§3.2); and P-tuning v2
(Liu et al. 2022), the same prefixes trained directly, without the MLP (`prefix_projection: false`, PEFT's
`prefix_projection=False`).

    P = Embedding(L, H);   P' = Linear(512 → 2·layers·H)(tanh(Linear(H → 512)(P)))     (prefix_projection: true)
    P' = Embedding(L, 2·layers·H), init N(0, 1) as nn.Embedding's (PEFT's and P-tuning v2's code)   (false)
One MLP shared by all layers; P' is cut into a key prefix and a value prefix per layer and head, which are
prepended to that layer's keys and values. Every token may attend to them; attention dropout applies as
usual. Gated: g = mean_t sigmoid(Linear(h_in,t)) from the attention input multiplies both prefixes.
Only the final L × 2 × layers × H tensor is needed after training, so that is what is counted (either way).

In a group, the members are attended in classes of equal prefix length (L = 0 for members without one), each
class with exactly its own prefixes, so no row attends to another member's or to padding. The prefixes reach
attention as a keyword argument that each architecture's attention module passes through untouched to
peltbench's attention function (methods/attention.py, which also says what a prefix position is on each encoder).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import nn

from ..architectures import get, put
from ..component import BOOL, Component, POSITIVE_INT, Positions, Setting
from .base import Coefficient, MemberLinear, Members, PeltModel, Selection, bert_normal, draw, mark

COMPONENT = Component(
    stage="module",
    settings={
        "prefix_length": Setting(POSITIVE_INT, "prefix length L"),
        "prefix_hidden": Setting(POSITIVE_INT, "width of prefix-tuning's reparameterisation MLP",
                                 read_if="prefix_projection", unread="the MLP's width, but prefix_projection=false "
                                 "trains the prefixes without the MLP (P-tuning v2)"),
        "prefix_projection": Setting(BOOL, "prefixes through the MLP (true, prefix-tuning) or trained directly (false, "
                                           "P-tuning v2)", default=True),
        "prefix_shift_positions": Setting(BOOL, "the tokens' positions follow the prefix (true: P-tuning v2's code, "
                                                "PEFT) or start at 0 (false)", default=False),
    },
    gate="the key and value prefixes of each layer, both by one gate from the attention input (§3.2)",
    positions=Positions("prefix_length", when="prefix_shift_positions", note="its positions come first"),
    label="Prefix-tuning", arxiv="2101.00190",
)


def projected(method: DictConfig) -> bool:
    """Whether the method's prefixes come from the MLP (prefix-tuning) or are trained directly (P-tuning v2)."""
    return bool(method.get("prefix_projection", True))


class PrefixEncoder(nn.Module):
    """Each member's P = Embedding(L, H) and its MLP, or (P-tuning v2) its P' itself (`key_values`); forward gives
    every active member's prefixes at once."""

    def __init__(self, members: Members, users: dict[int, DictConfig], hidden_size: int, layers: int, heads: int,
                 head_size: int) -> None:
        super().__init__()
        self.members = members
        self.users = tuple(sorted(users))
        self.projected = tuple(m for m in self.users if projected(users[m]))
        self.direct = tuple(m for m in self.users if not projected(users[m]))
        length = max(method.prefix_length for method in users.values())
        self.attention_size = heads * head_size  # a key's width: H in every supported encoder
        self.embedding = self.down = self.up = self.key_values = None
        if self.projected:
            width = max(users[m].prefix_hidden for m in self.projected)
            self.embedding = nn.Parameter(torch.zeros(members.count, length, hidden_size))
            self.down = MemberLinear(members, hidden_size, width)
            self.up = MemberLinear(members, width, 2 * layers * self.attention_size)
        if self.direct:
            self.key_values = nn.Parameter(torch.zeros(members.count, length, 2 * layers * self.attention_size))
        self.length, self.hidden_size, self.layers, self.heads = length, hidden_size, layers, heads
        lengths = [users[m].prefix_length if m in users else 0 for m in range(members.count)]
        self.member_lengths = lengths
        self._class_cache: dict = {}
        # Per member, how far its tokens' positions are shifted (P-tuning v2 numbers them after its prefix, as the
        # authors' code and PEFT do); None when no member shifts. Moves with the model.
        self.register_buffer("shifts", None, persistent=False)

    def forward(self) -> Prefixes | None:
        """The active members' prefixes, computed once per batch for every layer (None: no active member has one)."""
        device = self.device
        selection = self.members.select(self.users, device)
        if not selection.count:
            return None
        parts = []
        for kind in (self.projected, self.direct):
            within = self.members.select(kind, device, within=selection) if kind else None
            if within is not None and within.count:
                parts.append((within, self._compute(within, kind is self.projected)))
        if len(parts) == 1:
            flat = parts[0][1]
        else:  # both kinds active: each member's prefixes at its place among the selection (under autocast the MLP's
            # are bf16, the stored ones fp32: both kept in the wider type)
            dtype = torch.promote_types(parts[0][1].dtype, parts[1][1].dtype)
            flat = parts[0][1].new_empty(selection.count, *parts[0][1].shape[1:], dtype=dtype)
            for within, values in parts:
                flat = flat.index_copy(0, within.positions, values.to(dtype))
        key_values = flat.view(selection.count, self.length, self.layers, 2, self.heads, -1)
        return Prefixes(selection, key_values, self._classes(selection))

    @property
    def device(self) -> torch.device:
        return (self.embedding if self.embedding is not None else self.key_values).device

    def _compute(self, selection: Selection, through_mlp: bool) -> torch.Tensor:
        """The selected members' P' (members, L, 2·layers·H): through the MLP, or their own `key_values`."""
        if not through_mlp:
            return self.members.slots_of(self.key_values, selection)
        hidden = torch.tanh(self.down(self.members.slots_of(self.embedding, selection), selection))
        return self.up(hidden, selection)

    def _classes(self, selection: Selection) -> list:
        """The active members by prefix length: (length, which of the selection, positions among the active members);
        length 0: the members without a prefix. Once per set of active members."""
        key = (tuple(self.members.active_slots()), "prefix classes")
        if key not in self._class_cache:
            active = self.members.active_slots()
            users = [slot for slot in active if slot in self.users]
            device = self.device
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
        length = method.prefix_length
        if not projected(method):  # nn.Embedding's N(0, 1), as PEFT's and P-tuning v2's PrefixEncoder draw it
            draw(self.key_values[slot, :length], nn.init.normal_)
            return
        width = method.prefix_hidden
        draw(self.embedding[slot, :length], bert_normal)
        self.down.init_bert(slot, width, self.hidden_size)
        self.up.init_bert(slot, 2 * self.layers * self.attention_size, width)

    def stored_numel(self, slot: int) -> int:
        """What must be stored per task (methods.parameter_counts asks every module that has this method instead of
        counting its parameters): the member's L × 2 × layers × H prefix tensor (the MLP is discarded after
        training; P-tuning v2 trains that tensor itself)."""
        return self.member_lengths[slot] * 2 * self.layers * self.attention_size

    def stored_state(self, slot: int) -> dict[str, torch.Tensor]:
        """What `stored_numel` counts: the member's prefix P' (L × 2·layers·H), as its MLP computes it or its own
        `key_values` (methods.check_stored holds the two equal)."""
        selection = self.members.select((slot,), self.device)
        prefix = self._compute(selection, slot in self.projected)
        return {"prefix": prefix[0, : self.member_lengths[slot]]}


class PrefixSelfAttention(nn.Module):
    """Wraps a layer's attention module and hands it this layer's (gated) prefix for every row."""

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
    heads = config.num_attention_heads
    head_size = model.attention(model.layers[0]).attention_head_size if model.arch.relative_attention else \
        config.hidden_size // heads
    encoder = PrefixEncoder(model.members, users, config.hidden_size, config.num_hidden_layers, heads, head_size)
    model.prefix_encoder = encoder
    model.input_stages.append(_before_encoder)
    if encoder.projected:
        mark(model, [encoder.embedding, *encoder.down.parameters(), *encoder.up.parameters()], encoder.projected)
    if encoder.direct:
        mark(model, [encoder.key_values], encoder.direct)
    shifts = [users[m].prefix_length if m in users and users[m].get("prefix_shift_positions", False) else 0
              for m in range(model.members.count)]
    if any(shifts):  # P-tuning v2: the tokens' positions follow the prefix (_before_encoder)
        encoder.shifts = torch.tensor(shifts, dtype=torch.long, device=encoder.device)
    gated = [bool(users[m].gated) if m in users else False for m in range(model.members.count)]
    path = model.arch.attention
    for index, layer in enumerate(model.layers):
        coefficient = Coefficient(model.members, config.hidden_size, "prefix", index, gated, [1.0] * model.members.count)
        put(layer, path, PrefixSelfAttention(get(layer, path), model.members, coefficient, index))
        mark(model, coefficient.gate_parameters(), [m for m, g in enumerate(gated) if g])


def _before_encoder(model: PeltModel, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch's prefixes for every layer (computed once per forward pass), and where P-tuning v2 members number
    their tokens after the prefix, their shifted position ids."""
    encoder = model.prefix_encoder
    model.members.prefixes = encoder()
    if encoder.shifts is not None:
        positions = shifted_positions(model.arch, model.config, inputs["input_ids"], model.members.pick(encoder.shifts))
        if positions is not None:
            inputs["position_ids"] = positions
    return inputs


def shifted_positions(arch, config, input_ids: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor | None:
    """Each row's position ids with its member's tokens numbered from its shift (`shifts`: one per active member, rows
    member after member), as the model would number them after that many cached positions; None where the model has
    no absolute positions for a uniform shift to move (arch.positions)."""
    if arch.positions is None or (arch.positions_if and not getattr(config, arch.positions_if, False)):
        return None
    rows, length = input_ids.shape
    shift = shifts.to(input_ids.device).repeat_interleave(rows // shifts.shape[0])[:, None]
    if arch.positions == "after_padding_idx":  # RoBERTa: padding_idx + 1, 2, ... over the real tokens, pads at padding_idx
        real = input_ids.ne(config.pad_token_id).long()
        return (torch.cumsum(real, dim=1) + shift) * real + config.pad_token_id
    return torch.arange(length, device=input_ids.device)[None] + shift


def layout(method: DictConfig) -> int:
    """Members with one prefix length sit side by side in a group (methods.layout_key): their prefixes are one slice."""
    return int(method.prefix_length)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """P and its MLP, then the gates layer by layer: the order a separate run draws them in."""
    model.prefix_encoder.init_member(slot, method)
    for layer in model.layers:
        get(layer, model.arch.attention).coefficient.init_member(slot)


# PEFT's prefix tuning numbers the tokens after the L prefix positions (it passes past_key_values, and shifts
# position ids it is given), and refuses DeBERTa-v2 and ModernBERT, which take no past_key_values.
NO_PEFT_PREFIX = ("PEFT's prefix tuning shifts every position id by the prefix length (and cannot run on DeBERTa-v2 "
                  "or ModernBERT), so a PEFT copy would not predict what this run does (docs/saving.md)")
NO_PEFT_SHIFTED = ("peltbench writes no PEFT copy of a prefix run (a P-tuning v2 run with shifted positions computes what "
                   "PEFT's prefix tuning computes on BERT and RoBERTa, but its export is not implemented: docs/saving.md)")


def peft_refusal(method: DictConfig, arch) -> str:
    """Why a prefix run has no PEFT copy (saving.peft_kind)."""
    return NO_PEFT_SHIFTED if method.get("prefix_shift_positions", False) else NO_PEFT_PREFIX
