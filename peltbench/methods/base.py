"""What every PELT method shares: the group of runs on one backbone, member-stacked layers, the gate, freezing.

A model here carries the PELT modules of a *group* of runs ("members") that share one frozen pretrained
backbone. The rows of a batch are the members' batches concatenated (member 0's rows, then member 1's, ...),
each member contributing the same number of rows; every new weight has a leading member dimension and is
applied to its member's rows with one batched matmul. A separate run is a group of one: the same modules,
member dimension 1. A member that does not use a component holds zeros in that component's slot (or, for
prefixes, a fully masked one), so its rows see exactly the backbone without that component.

Components attach their modules with `install(model, users)` and draw one member's initial weights with
`init_member(model, slot, method)`, in the order a separate run draws them, after the model seed is set.
Which member trains which tensor is recorded in `model.trains` (parameter name → one flag per member); the
optimiser and the gradient clipping are per member (peltbench.train).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..architectures import (Architecture, activation_name, architecture, get, head_input, head_pooling,
                             mlm_transform, pooled, put, unwrapped)
from ..component import ComponentError

INIT_STD = 0.02  # BERT's init for new Linear weights (docs/protocol.md); biases start at 0


class Members:
    """The members of a group, and what one forward pass shares between the modules of the model.

    `active`: the member slots whose rows are in the current batch (None: all of them, in slot order). Members
    leave a group when they stop early; their slots stay in place, and modules pick the active slots.
    `token_mask`: the padding mask the backbone received, for the gates' masked mean.
    `padded_pooling`: gates average over every position of a batch padded to max length (the authors' code).
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.active: torch.Tensor | None = None
        self._active_slots = list(range(count))  # the same on the host: asking for it never waits on a device
        self._active_span: slice | None = None   # the active slots when they are consecutive (a view, not a copy)
        self._selections: dict[tuple[int, ...], Selection] = {}
        self._token_mask: torch.Tensor | None = None
        self._pooling: dict = {}  # the gates' masked-mean weights of the current token mask, per selection
        self.padded_pooling = False
        self.prefixes: dict[int, tuple] | None = None  # per-forward prefix keys/values, see prefix.py
        # What the modules compute once per forward pass for all of them (rotation.py: every rotation's matrices);
        # None outside PeltModel.forward (a module then computes its own)
        self.per_pass: dict | None = None
        self._gate_log: list | None = None
        self._gate_rows: torch.Tensor | None = None
        self._positional = False
        self.dropout_sites = 0   # how many dropout sites the model has (methods/randomness.py)
        self.rows = 0            # rows of the current forward pass
        self._keys = None        # the dropout keys of the current forward pass (randomness.Keys)

    @property
    def active_count(self) -> int:
        return len(self._active_slots)

    @property
    def token_mask(self) -> torch.Tensor | None:
        return self._token_mask

    @token_mask.setter
    def token_mask(self, mask: torch.Tensor | None) -> None:
        self._token_mask, self._pooling = mask, {}

    def pooling(self, selection: Selection, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The selected members' token mask as `dtype` (rows, tokens) and its real tokens per row (at least 1), for
        the gates' masked mean: made once per forward pass, not once per gate. None: no mask (or padded pooling)."""
        if self._token_mask is None or self.padded_pooling:
            return None
        key = (selection.users, selection.blocks, dtype)
        if key not in self._pooling:
            mask = self.gather(selection, self._token_mask, view=True).to(dtype)
            self._pooling[key] = mask, mask.sum(dim=1).clamp(min=1)
        return self._pooling[key]

    def set_active(self, slots: list[int] | None, device: torch.device | None = None) -> None:
        slots = list(range(self.count)) if slots is None else [int(slot) for slot in slots]
        self._active_slots = slots
        self.active = None if slots == list(range(self.count)) else torch.tensor(slots, dtype=torch.long, device=device)
        self._active_span = _span(slots)
        self._selections = {}

    def select(self, users: tuple[int, ...], device: torch.device, within: Selection | None = None) -> Selection:
        """Which of the active members use a component (its `users`), as positions among the active members' blocks
        of rows, or, `within` a selection, among that selection's blocks. Computed once per set of active members,
        on the host: no step waits on the device for it."""
        key = (users, None if within is None else within.users)
        if key not in self._selections:
            rows = self._active_slots
            if within is not None:
                rows = [slot for slot in rows if slot in within.users]
            positions = [i for i, slot in enumerate(rows) if slot in users]
            slots = [rows[i] for i in positions]
            self._selections[key] = Selection(
                users=users, every=len(positions) == len(rows), count=len(positions),
                positions=torch.tensor(positions, dtype=torch.long, device=device), span=_span(positions),
                slots=None if self.active is None and len(positions) == self.count else
                torch.tensor(slots, dtype=torch.long, device=device), slot_span=_span(slots),
                blocks=len(rows), slot_list=tuple(slots))
        return self._selections[key]

    def gather(self, selection: Selection, x: torch.Tensor, view: bool = False) -> torch.Tensor:
        """The selected members' rows of x (rows, ...), member after member: where every member is selected, x itself
        (a view of it in a forward pass), else a copy of their rows (one index_select), which is what a product saves
        for its backward pass, not all of x. In a forward pass one node per x and selection, whichever module asks,
        whether every member is selected or some (its gradient the sum of what was computed from those rows, then
        added to x's once: so a member's gradient sums the same terms in the same order alone and in any group), and
        one copy per tensor and selection: the funnels of one x share it (`funnel`; q and v read the same rows).
        `view`: a view where the members are consecutive, for a caller that only reads it (nothing saved)."""
        n = x.shape[0] // selection.blocks
        if view and (selection.every or selection.span is not None):
            return x if selection.every else x[selection.span.start * n : selection.span.stop * n]
        cache = self.per_pass
        if cache is None:
            return x if selection.every else x.index_select(0, selection.rows(n, x.device))
        key = ("rows", id(x), selection.users, selection.blocks)
        found = cache.get(key)
        if found is None or found[0]() is not x:  # the weak reference: not a later tensor at the same address
            found = (weakref.ref(x), x.view_as(x) if selection.every else self._rows(selection, x, n))
            cache[key] = found
        return found[1]

    def _rows(self, selection: Selection, x: torch.Tensor, n: int) -> torch.Tensor:
        """x.index_select(0, the selected rows), from one copy per funnelled tensor and selection (`gather`)."""
        index = selection.rows(n, x.device)
        funnelled = self.per_pass.get(("funnel", id(x)))
        source = funnelled[1] if funnelled is not None and funnelled[0]() is x else x
        if source is x:
            return x.index_select(0, index)
        key = ("copy", id(source), selection.users, selection.blocks)
        found = self.per_pass.get(key)
        if found is None or found[0]() is not source:
            found = (weakref.ref(source), source.detach().index_select(0, index))
            self.per_pass[key] = found
        return _SharedRows.apply(x, index, found[1])  # (a funnel is made only where x has a gradient)

    def funnel(self, x: torch.Tensor) -> torch.Tensor:
        """x as one projection's own input (a view of it, in a training forward pass): the gradients of all that the
        projection and its components compute from x reach x's gradient as one sum (on a member's rows: the
        projection's and its own deltas'), the same terms in the same order alone and in any group. Without it a
        member's terms of x's gradient grouped otherwise beside other members' components there (a rotation of q's
        input, rows gathered for some members, shared by q and v) than alone, and a float sum grouped otherwise
        rounds otherwise: FourierFT, whose delta is not zero at the start, then ended 8 steps 1.9e-4 (beside LoRA)
        to 4.5e-4 (beside HRA, OFT, BOFT) of a train loss from its run alone (tiny BERT, RTE K = 16, lr 5e-2, clip
        3; issue 48); now bit for bit on a CPU."""
        if self.per_pass is None or not (x.requires_grad and torch.is_grad_enabled()):
            return x
        funnelled = x.view_as(x)
        found = self.per_pass.get(("funnel", id(x)))
        source = found[1] if found is not None and found[0]() is x else x  # a funnel's funnel: the first tensor
        self.per_pass[("funnel", id(funnelled))] = (weakref.ref(funnelled), source)
        return funnelled

    def add_rows(self, selection: Selection, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """x plus delta on the selected members' rows (delta: their rows, as `gather` gives them, or member by member
        (selected members, rows per member, ...)); the other rows are x's. One operator: x + delta, or, for some
        members, x.index_add (out of place: its backward passes the gradient through and indexes delta's). Under
        autocast x and delta may differ in dtype (a LayerNorm's fp32 output, a bf16 matmul's delta): delta takes x's
        dtype where only some members are selected, as an in-place `+=` would."""
        if selection.every:
            if delta.shape != x.shape:
                delta = delta.reshape(x.shape)
            return x + delta
        n = x.shape[0] // selection.blocks
        if delta.shape[0] != selection.count * n or delta.dim() != x.dim():
            delta = delta.reshape(selection.count * n, *x.shape[1:])
        return _AddRows.apply(x, selection.rows(n, x.device), delta.to(x.dtype))

    def replace_rows(self, selection: Selection, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """x with the selected members' rows replaced by `rows` (as `gather` gives them): `rows` itself where every
        member is selected, else one index_copy (out of place: x may be saved for a backward pass). Under autocast
        `rows` takes x's dtype."""
        if selection.every:
            return rows
        n = x.shape[0] // selection.blocks
        return _ReplaceRows.apply(x, selection.rows(n, x.device), rows.to(x.dtype))

    def slots_of(self, tensor: torch.Tensor, selection: Selection | None = None, dim: int = 0) -> torch.Tensor:
        """A member-stacked tensor's slots (its dimension `dim`) for the selected members (default: every active
        member): the tensor itself, a view (consecutive slots) or one index_select."""
        if selection is None:
            return self.pick(tensor) if dim == 0 else self.slots_of(tensor, self.select(
                tuple(range(self.count)), tensor.device), dim)
        if selection.slots is None:
            return tensor
        if selection.slot_span is not None:
            return tensor.narrow(dim, selection.slot_span.start, selection.slot_span.stop - selection.slot_span.start)
        return tensor.index_select(dim, selection.slots.to(tensor.device))

    def active_slots(self) -> list[int]:
        return self._active_slots

    def pick(self, tensor: torch.Tensor) -> torch.Tensor:
        """The active members' slots of a tensor with a leading member dimension."""
        if self.active is None:
            return tensor
        if self._active_span is not None:
            return tensor[self._active_span]
        return tensor.index_select(0, self.active.to(tensor.device))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, ...) → (active members, rows per member, ...)."""
        return x.view(self.active_count, -1, *x.shape[1:])

    def set_dropout_keys(self, keys) -> None:
        """The dropout keys of the coming training forward pass (randomness.step_keys); None: forget them."""
        self._keys = keys

    def dropout_keys(self, site: int, device: torch.device, dims: int) -> torch.Tensor:
        """One key per row of the current forward pass at a dropout site (per member inside `positional`), shaped
        (rows, 1, ...) to broadcast over `dims` trailing dimensions."""
        if self._keys is None:  # a training-mode forward outside the training loop (randomness.default_keys)
            from .randomness import default_keys

            self._keys = default_keys(self.rows, self.active_count, self.dropout_sites, device)
        return self._keys.at(site, self._positional, dims)

    @contextmanager
    def positional(self):
        """Inside: the modules see one block per member that is not tokens of examples (DeBERTa's relative embeddings,
        methods/attention.py): no padding mask applies, and gates computed there are not recorded."""
        mask, self.token_mask, self._positional = self.token_mask, None, True
        try:
            yield
        finally:
            self.token_mask, self._positional = mask, False

    # ---- gate statistics: the mean gate per member, submodule and layer (for the record and the loggers)

    def start_gate_recording(self) -> None:
        self._gate_log = []

    def set_gate_rows(self, rows: torch.Tensor | None) -> None:
        """Which rows of the coming batches count (bool per row; None: all): evaluation pads some members' rows."""
        self._gate_rows = rows

    def observe_gate(self, submodule: str, layer: int, values: torch.Tensor, selection: Selection,
                     owners: torch.Tensor) -> None:
        """Gate values of the selected members' rows (kept as they are; summed once, at the end). `owners`: per member
        slot, whether the gate is its own (in a mixed group an ungated member's rows pass through it unused)."""
        if self._gate_log is not None and not self._positional:
            slots = selection.slots if selection.slots is not None else torch.arange(self.count, device=values.device)
            rows = None if self._gate_rows is None else self.gather(selection, self._gate_rows, view=True)
            self._gate_log.append((submodule, layer, values.detach(), slots, rows, owners.index_select(0, slots)))

    def stop_gate_recording(self) -> list[dict[str, list[float]] | None]:
        """Per member: mean gate per submodule and layer since `start_gate_recording` (None for a member without gates)."""
        log, self._gate_log, self._gate_rows = self._gate_log, None, None
        if not log:
            return [None] * self.count
        keys = sorted({(submodule, layer) for submodule, layer, *_ in log})
        totals = torch.zeros(len(keys), 2, self.count, device=log[0][2].device)
        for submodule, layer, values, slots, rows, owners in log:
            weight = torch.ones_like(values, dtype=torch.float32) if rows is None else rows.float()
            members = len(slots)
            weight = weight.view(members, -1) * owners[:, None]
            sums = torch.stack([(values.float().view(members, -1) * weight).sum(1), weight.sum(1)])
            totals[keys.index((submodule, layer))].index_add_(1, slots, sums)
        totals = totals.cpu()
        layers = 1 + max(layer for _, layer in keys)
        result: list[dict[str, list[float]] | None] = []
        for slot in range(self.count):
            means: dict[str, list[float]] = {}
            for (submodule, layer), (total, count) in zip(keys, totals[:, :, slot].tolist()):
                if count > 0:
                    means.setdefault(submodule, [float("nan")] * layers)[layer] = total / count
            result.append(means or None)
        return result


class _AddRows(torch.autograd.Function):
    """x.index_add(0, rows, delta), keeping only the index for the backward pass (autograd's own index_add keeps
    delta too, for its shape)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows)
        return x.index_add(0, rows, delta)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (rows,) = ctx.saved_tensors
        return grad, None, grad.index_select(0, rows) if ctx.needs_input_grad[2] else None


class _SharedRows(torch.autograd.Function):
    """x.index_select(0, rows) given as `values`, a copy of those rows already made (from the tensor x is a funnel of:
    Members.funnel), so that the funnels of one tensor share one copy; each one's gradient goes to its own x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows)
        ctx.size = x.shape
        return values.view_as(values)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (rows,) = ctx.saved_tensors
        return grad.new_zeros(ctx.size).index_add_(0, rows, grad), None, None


class _ReplaceRows(torch.autograd.Function):
    """x.index_copy(0, rows, values), keeping only the index for the backward pass (autograd's own index_copy keeps
    values too, for its shape)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows)
        return x.index_copy(0, rows, values)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (rows,) = ctx.saved_tensors
        return (grad.index_fill(0, rows, 0) if ctx.needs_input_grad[0] else None, None,
                grad.index_select(0, rows) if ctx.needs_input_grad[2] else None)


@dataclass
class Selection:
    """The active members that use one component: their positions among the active members' blocks of rows, and
    their member slots (None: every member, in slot order). `every`: all the active members use it."""

    users: tuple[int, ...]
    every: bool
    count: int
    positions: torch.Tensor
    span: slice | None  # the positions when they are consecutive: rows are then a view, not a copy
    slots: torch.Tensor | None
    slot_span: slice | None = None  # the slots when they are consecutive: a parameter's slots are then a view
    blocks: int = 0  # blocks of rows the positions count in: the active members, or a `within` selection's
    slot_list: tuple[int, ...] = ()  # the selected members' slots, on the host
    _rows: dict = field(default_factory=dict, repr=False)

    def flags(self, device: torch.device) -> torch.Tensor:
        """(blocks, 1) float: 1 for the selected members' blocks, 0 for the others' (made once per device)."""
        key = ("flags", device)
        if key not in self._rows:
            flags = torch.zeros(self.blocks, 1, dtype=torch.float32)
            flags[self.positions.cpu()] = 1.0
            self._rows[key] = to_device(flags, device)
        return self._rows[key]

    def fixed(self, key: tuple, make) -> tuple[torch.Tensor, ...]:
        """What `make()` picks from fixed buffers (their selected slots: values that never change), made once per
        selection and `key` (the buffers themselves: a buffer moved to another device or dtype is another tensor), not
        once per forward pass."""
        key = ("fixed", *key)
        if key not in self._rows:
            with torch.inference_mode(False):  # made in an evaluation pass, used in a training one too
                self._rows[key] = make()
        return self._rows[key]

    def rows(self, n: int, device: torch.device) -> torch.Tensor:
        """The selected members' rows, at n rows per member (made once per n and device)."""
        key = (n, device)
        if key not in self._rows:
            positions = self.positions.to(device)
            self._rows[key] = (positions[:, None] * n + torch.arange(n, device=device)).flatten()
        return self._rows[key]


def rows_for(tensor: torch.Tensor, owners: tuple[int, ...], selection: Selection, cache: dict) -> torch.Tensor:
    """The selected members' entries of a tensor that holds one entry per member in `owners` (not one per member of
    the group): a view where they are consecutive there, else one index_select (its index made once)."""
    positions = [owners.index(slot) for slot in selection.slot_list]
    span = _span(positions)
    if span is not None:
        return tensor if span == slice(0, tensor.shape[0]) else tensor[span]
    key = (tuple(positions), tensor.device)
    if key not in cache:
        cache[key] = to_device(torch.tensor(positions), tensor.device)
    return tensor.index_select(0, cache[key])


def _span(positions: list[int]) -> slice | None:
    """The positions as a slice where they are consecutive (and not empty), else None."""
    if positions and positions == list(range(positions[0], positions[-1] + 1)):
        return slice(positions[0], positions[-1] + 1)
    return None


def to_device(tensor: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """A small host tensor on `device` without the host waiting for the device: on CUDA through pinned memory,
    asynchronously (a plain copy from pageable memory waits for the queued work)."""
    if device is None or torch.device(device).type != "cuda":
        return tensor.to(device) if device is not None else tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def draw(target: torch.Tensor, init) -> None:
    """Fill `target` (one member's slot, maybe a strided view) with `init` drawn on a fresh tensor of its shape,
    so the random numbers fall exactly as they would in a separate run's own nn.Linear."""
    fresh = torch.empty(target.shape, dtype=target.dtype, device=target.device)
    init(fresh)
    with torch.no_grad():
        target.copy_(fresh)


def bert_normal(tensor: torch.Tensor) -> torch.Tensor:
    return nn.init.normal_(tensor, std=INIT_STD)


class MemberLinear(nn.Module):
    """y = x W_mᵀ + b_m for the rows of member m. weight (members, out, in), bias (members, out).

    A member's slot has exactly nn.Linear's shapes, so it saves, loads and initialises as one.
    Slots start at zero; a member that does not use the layer keeps zeros there and gets y = 0.
    """

    def __init__(self, members: Members, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.members = members
        self.weight = nn.Parameter(torch.zeros(members.count, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(members.count, out_features)) if bias else None

    def forward(self, x: torch.Tensor, selection: Selection | None = None) -> torch.Tensor:
        """x: the rows of the selected members (default: every active member), member after member."""
        count = self.members.active_count if selection is None else selection.count
        return self.grouped(x.reshape(count, -1, x.shape[-1]), selection).view(*x.shape[:-1], -1)

    def grouped(self, x: torch.Tensor, selection: Selection | None = None) -> torch.Tensor:
        """x: (selected members, rows, in) → (selected members, rows, out), one batched matmul."""
        weight = self.members.slots_of(self.weight, selection).transpose(1, 2)
        if self.bias is None:
            return torch.bmm(x, weight)
        return torch.baddbmm(self.members.slots_of(self.bias, selection).unsqueeze(1), x, weight)

    def init_bert(self, slot: int, rows: int, columns: int) -> None:
        """BERT's init for a new Linear of `columns` → `rows` in this slot: weight N(0, 0.02), bias 0."""
        draw(self.weight[slot, :rows, :columns], bert_normal)


class Gate(nn.Module):
    """UniPELT's gate (§3.2): g = mean over tokens t of sigmoid(Linear_H→1(x_t)), one scalar per example.

    The mean is over real tokens (docs/protocol.md §5), or, with gate_pooling=padded,
    over every position of a batch padded to max length, as the authors' code did.
    """

    def __init__(self, members: Members, hidden_size: int, submodule: str, layer: int, owners: list[bool]) -> None:
        super().__init__()
        self.linear = MemberLinear(members, hidden_size, 1)
        self.members = members
        self.submodule = submodule
        self.layer = layer
        self.register_buffer("owners", torch.tensor(owners, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor, selection: Selection | None = None) -> torch.Tensor:
        """x: the selected members' rows (default: every active member's) (rows, tokens, hidden) → g: (rows,)."""
        if selection is None:
            selection = self.members.select(tuple(range(self.members.count)), x.device)
        grouped = x.reshape(selection.count, -1, x.shape[-1])
        per_token = torch.sigmoid(self.linear.grouped(grouped, selection)).view(x.shape[:2])
        pooling = self.members.pooling(selection, per_token.dtype)
        if pooling is None:
            gate = per_token.mean(dim=1)
        else:
            mask, count = pooling
            gate = (per_token * mask).sum(dim=1) / count
        self.members.observe_gate(self.submodule, self.layer, gate, selection, self.owners)
        return gate


class Coefficient(nn.Module):
    """What multiplies a submodule's output for each member: its gate when the member's method is gated,
    else a constant (1 for an adapter, `lora_scale` for LoRA). With no gated member and every constant 1 it
    is nothing at all, and the submodule's output is used as it is."""

    def __init__(self, members: Members, hidden_size: int, submodule: str, layer: int,
                 gated: list[bool], constants: list[float]) -> None:
        super().__init__()
        self.members = members
        self.gate = Gate(members, hidden_size, submodule, layer, gated) if any(gated) else None
        self.mixed = any(gated) and not all(gated)
        self.needs_constant = not all(gated) and any(c != 1.0 for c, g in zip(constants, gated) if not g)
        self.gated_members = list(gated)
        self.register_buffer("gated", torch.tensor(gated, dtype=torch.bool).view(-1, 1, 1), persistent=False)
        self.register_buffer("constant", torch.tensor(constants, dtype=torch.float32).view(-1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor, selection: Selection) -> torch.Tensor | None:
        """For the selected members' rows x: (members, rows per member, 1) or (members, 1, 1); None when it is 1 for
        all."""
        if self.gate is None:
            return self._fixed(selection)[1] if self.needs_constant else None
        gate = self.gate(x, selection).view(selection.count, -1, 1)
        if self.mixed:
            gated, constant = self._fixed(selection)
            gate = torch.where(gated, gate, constant)
        return gate

    def _fixed(self, selection: Selection) -> tuple[torch.Tensor, torch.Tensor]:
        """The selected members' `gated` flags and constants (fixed: picked once per selection)."""
        slots = self.members.slots_of
        return selection.fixed((self.gated, self.constant),
                               lambda: (slots(self.gated, selection), slots(self.constant, selection)))

    def init_member(self, slot: int) -> None:
        if self.gate is not None and self.gated_members[slot]:
            self.gate.linear.init_bert(slot, 1, self.gate.linear.weight.shape[2])

    def gate_parameters(self) -> list[nn.Parameter]:
        return [] if self.gate is None else list(self.gate.parameters())


def scale_grouped(grouped: torch.Tensor, coefficient: torch.Tensor) -> torch.Tensor:
    """grouped (members, rows · tokens, features) times a per-member, per-row coefficient (members, rows per member
    or 1, 1): one multiplication where it is per member."""
    if coefficient.shape[1] == 1:
        return grouped * coefficient.to(grouped.dtype)
    return (grouped.view(*coefficient.shape[:2], -1) * coefficient.to(grouped.dtype)).view(grouped.shape)


class MemberHead(nn.Module):
    """The new layers of the classification head, one per member, as the model's `*ForSequenceClassification`
    defines them (architectures.Head): logits_m = out_m(drop(x)) on BERT's pooled output or ModernBERT's pretrained
    head, or out_m(drop(act(dense_m(drop(x))))) on the first token (RoBERTa, ELECTRA, DeBERTa's pooler).

    It runs in fp32 even under bf16 autocast, and so does the loss: bf16 logits collapse a narrow band of
    regression predictions (STS-B) onto a few values.
    """

    def __init__(self, members: Members, sources: list[dict[str, nn.Linear]], activation: str | None,
                 dropout: float, dense_dropout: float) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.members = members
        self.out = _stacked_linear(members, [source["out"] for source in sources])
        self.dense = None
        if sources[0].get("dense") is not None:
            self.dense = _stacked_linear(members, [source["dense"] for source in sources])
        self.activation = ACT2FN[activation] if activation else None
        self.dropout = nn.Dropout(dropout)
        self.dense_dropout = nn.Dropout(dense_dropout)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=pooled.device.type, enabled=False):
            x = pooled.float()
            if self.dense is not None:
                x = self.activation(self.dense(self.dense_dropout(x)))
            return self.out(self.dropout(x))

    def linears(self) -> dict[str, MemberLinear]:
        return {"dense": self.dense, "out": self.out} if self.dense is not None else {"out": self.out}


def _stacked_linear(members: Members, linears: list[nn.Linear]) -> MemberLinear:
    """A MemberLinear holding each member's copy of a Linear (in fp32)."""
    out_features, in_features = linears[0].weight.shape
    stacked = MemberLinear(members, in_features, out_features)
    with torch.no_grad():
        stacked.weight.copy_(torch.stack([linear.weight.detach().float() for linear in linears]))
        stacked.bias.copy_(torch.stack([linear.bias.detach().float() for linear in linears]))
    return stacked


@dataclass(frozen=True)
class Cloze:
    """What objective=cloze builds a model with: each member's label-word ids (its classes in order; a regression
    task's low and high poles) and the tokenizer's mask token id."""

    label_words: tuple[tuple[int, ...], ...]
    mask_id: int
    regression: bool = False


class ClozeHead(nn.Module):
    """objective=cloze, LM-BFF's prompt-based fine-tuning (src/models.py, *ForPromptFinetuning): each member's scores of
    its classes' label words at the mask, from the pretrained masked-LM head (architectures.MaskedLM):

        t = norm(act(dense(h_mask)))            the head's transform: pretrained, part of the backbone
        logits_m = t W_mᵀ + b_m                 W_m, b_m: the decoder's rows and biases of member m's C label words

    Only the C label-word rows are computed: LM-BFF projects onto the whole vocabulary and keeps those C columns (the
    same numbers; V/C times the work, 15,000× for BERT's 30,522 words and two classes). The rows are copies of the
    decoder's, which are the word embeddings (tied): LM-BFF's transformers-3.4 models load the decoder untied, so
    training the label words' rows leaves the input embeddings as they are, as here. A regression task (STS-B) has
    two label words, its low and high poles; its outputs are their log-probabilities (log-softmax over the two), as
    LM-BFF's forward computes them (train.member_losses, train.predicted read them).

    It runs in fp32 even under bf16 autocast, as MemberHead does.
    """

    def __init__(self, members: Members, backbone: nn.Module, arch: Architecture, cloze: Cloze) -> None:
        super().__init__()
        mlm = arch.masked_lm
        decoder = get(backbone, mlm.decoder)
        bias = get(backbone, mlm.bias) if mlm.bias else decoder.bias
        self.members, self.regression = members, cloze.regression
        self.out = MemberLinear(members, decoder.in_features, len(cloze.label_words[0]))
        with torch.no_grad():
            for slot, words in enumerate(cloze.label_words):
                ids = torch.tensor(words, dtype=torch.long, device=decoder.weight.device)
                self.out.weight[slot].copy_(decoder.weight[ids].float())
                if bias is not None:
                    self.out.bias[slot].copy_(bias[ids].float())
        put(backbone, mlm.decoder, None)  # the vocabulary projection is never computed: only these rows are
        if mlm.bias:
            put(backbone, mlm.bias, None)

    def forward(self, transformed: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=transformed.device.type, enabled=False):
            logits = self.out(transformed.float())
            return torch.log_softmax(logits, dim=-1) if self.regression else logits

    def linears(self) -> dict[str, MemberLinear]:
        return {"out": self.out}


def mask_positions(input_ids: torch.Tensor, mask_id: int, offset: int) -> torch.Tensor:
    """Each row's first mask token (LM-BFF: `input_ids.index(mask_token_id)`), shifted by the positions an input stage
    put in front (prompt tuning's P)."""
    return (input_ids == mask_id).to(torch.int8).argmax(dim=1) + offset


def head_layers(arch: Architecture, model: nn.Module) -> dict[str, nn.Linear]:
    """The new layers of a `*ForSequenceClassification` model's head: {"out": Linear} and, where it has one, "dense"."""
    layers = {"out": get(model, arch.head.out)}
    if arch.head.dense is not None:
        layers["dense"] = get(model, arch.head.dense)
    return layers


class PeltModel(nn.Module):
    """An encoder with the PELT modules of a group of members attached; forward returns the logits.

    `backbone` is a `*ForSequenceClassification` of one of the supported architectures (methods/architectures.py);
    its new head layers move into `head` (one per member), the rest is the pretrained, frozen backbone.
    The rows of `input_ids` are the active members' rows, member by member, the same number per member.
    The classifier objective: `poolings` is what each member's head reads (objective.pooling, decided: head, pooler,
    first, mean or max; default head for all), each member's own in one forward pass (the pooling follows the shared
    encoder). objective=cloze (`cloze`): `backbone` is a `*ForMaskedLM`, the head scores each member's label words at
    the mask (ClozeHead); a fused group holds one objective (peltbench.fusion), so a model has one kind of head.
    """

    def __init__(self, backbone: nn.Module, members: Members, heads: list[nn.Module],
                 poolings: list[str] | None = None, cloze: Cloze | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.arch = architecture(backbone.config.model_type)
        self.members = members
        self.mask_id = None if cloze is None else cloze.mask_id
        if cloze is not None:  # `backbone` is a *ForMaskedLM; each member scores its label words at the mask
            if poolings is not None:
                raise ValueError("a cloze model reads each row's mask token: it has no classifier pooling")
            self.head, self.poolings = ClozeHead(members, backbone, self.arch, cloze), []
        else:
            own = head_pooling(self.arch, backbone.config)
            self.poolings = [own if kind == "head" else kind for kind in (poolings or ["head"] * members.count)]
            self.head = self._classifier(backbone, members, heads)
        # The denominator of Table 4's "% of the backbone": the pretrained model without the new head layers.
        self.backbone_params = sum(p.numel() for p in backbone.parameters())
        config = backbone.config
        self.token_types = self.arch.token_types and getattr(config, "type_vocab_size", 0) > 0
        self.components: list[str] = []  # the components installed (training hooks: methods.plan_training ...)
        # What components do to a batch's inputs before the encoder, in the order they were installed: stage(model,
        # inputs) → inputs (prefix.py: the batch's prefixes and shifted positions; prompt.py: prompts in front).
        self.input_stages: list = []
        self.trains: dict[str, list[bool]] = {}  # parameter name → does member m train it
        self.unstacked: set[str] = set()  # trained parameters without a member dimension (fine-tuning's backbone)
        self._marked: dict[int, list[bool]] = {}
        self._unstacked: set[int] = set()
        self._installing: str | None = None  # the component being attached (build_pelt_model), which `mark` notes
        self._marked_by: dict[int, str | None] = {}  # parameter → the component that marked it first

    def _classifier(self, backbone: nn.Module, members: Members, heads: list[nn.Module]) -> MemberHead:
        head = self.arch.head
        dropout = get(backbone, head.dropout).p
        dense_dropout = get(backbone, head.dense_dropout).p if head.dense_dropout else 0.0
        layers = MemberHead(members, [head_layers(self.arch, source) for source in heads],
                            activation_name(head, backbone.config), dropout, dense_dropout)
        for path in {path.split(".")[0] for path in (head.out, head.dense) if path}:
            put(backbone, path, None)  # each member's own head replaces them
        return layers

    @property
    def config(self):
        return self.backbone.config

    @property
    def encoder(self) -> nn.Module:
        """The pretrained encoder (`bert`, `roberta`, `deberta`, `electra`, ModernBERT's `model`)."""
        return self.backbone.base_model

    @property
    def layers(self) -> nn.ModuleList:
        return get(self.encoder, self.arch.layers)

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    def attention(self, layer: nn.Module) -> nn.Module:
        """The layer's own attention module (q/k/v projections), under any peltbench wrapper."""
        return unwrapped(get(layer, self.arch.attention))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        self.members.token_mask, self.members.rows = attention_mask, input_ids.shape[0]
        self.members.per_pass = {}
        try:
            inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if self.token_types and token_type_ids is not None:
                inputs["token_type_ids"] = token_type_ids
            for stage in self.input_stages:
                inputs = stage(self, inputs)
            attention_mask = self.members.token_mask = inputs["attention_mask"]  # a stage may widen it (prompts)
            output = self.encoder(**inputs)
            if self.mask_id is None:
                return self.head(head_input(self.arch, self.backbone, self.pool(output, attention_mask)))
            hidden = output.last_hidden_state
            at_mask = mask_positions(input_ids, self.mask_id, hidden.shape[1] - input_ids.shape[1])
            masked = hidden[torch.arange(hidden.shape[0], device=hidden.device), at_mask]
            return self.head(mlm_transform(self.arch, self.backbone, masked))
        finally:
            self.members.token_mask = None
            self.members.prefixes = None
            self.members.per_pass = None
            self.members.set_dropout_keys(None)

    def pool(self, output, attention_mask: torch.Tensor) -> torch.Tensor:
        """One vector per row, each active member's rows pooled as its own `poolings` entry says: one pooling for all
        where they share it; else each kind the active members use on every row, the members' rows then taken from
        their own (a mean over a row costs one masked sum, BERT's pooler a Linear on one token a row)."""
        kinds = [self.poolings[slot] for slot in self.members.active_slots()]
        if len(set(kinds)) == 1:
            return pooled(kinds[0], output, attention_mask)
        vectors = None
        for kind in dict.fromkeys(kinds):
            mine = pooled(kind, output, attention_mask)
            if vectors is None:
                vectors = mine
                continue
            users = tuple(slot for slot, own in enumerate(self.poolings) if own == kind)
            selection = self.members.select(users, mine.device)
            vectors = self.members.replace_rows(selection, vectors, self.members.gather(selection, mine))
        return vectors

    def member_parameters(self) -> list[tuple[str, nn.Parameter, list[bool], bool]]:
        """(name, parameter, flags, stacked) for every trained parameter: flags say which members train it;
        stacked: it has a leading member dimension (all but fine-tuning's backbone weights)."""
        named = dict(self.named_parameters())
        return [(name, named[name], flags, name not in self.unstacked) for name, flags in self.trains.items() if any(flags)]

    def stored_name(self, name: str) -> str:
        """A parameter's name as the plain (unwrapped) Hugging Face model has it: wrappers' `base.` / `inner.`
        segments and the `backbone.` prefix go, so the model's own tensors keep their names
        (`bert.encoder.layer.0.output.LayerNorm.weight`), and the head's layers take the names of the layers they
        replace (`classifier.weight`; RoBERTa's `classifier.dense.weight`, `classifier.out_proj.weight`)."""
        parts = [part for part in name.split(".") if part not in ("base", "inner")]
        if parts[:1] == ["head"] and self.mask_id is not None:  # a cloze head: the label words' decoder rows, in order
            return ".".join(["label_words", *parts[2:]])
        if parts[:1] == ["head"]:  # this model's own head, not a pretrained one in the backbone (ModernBERT's `head`)
            return ".".join([*getattr(self.arch.head, parts[1]).split("."), *parts[2:]])
        if parts[:1] == ["backbone"]:
            parts = parts[1:]
        return ".".join(parts)


def mark(model: PeltModel, what, slots, stacked: bool = True) -> None:
    """The members in `slots` train `what`: a module (all its parameters) or a list of parameters.

    Kept by parameter while components are attached (a later wrapper renames them); `freeze_all_but_trained`
    turns it into `model.trains`, by name. A parameter's first dimension is the member dimension (one slot per member
    of the group); `stacked=False`: it has none (fine-tuning's backbone weights), one tensor for every member, which
    only a component declared `alone` may train (`check_marks`)."""
    for parameter in (what.parameters() if isinstance(what, nn.Module) else what):
        flags = model._marked.setdefault(id(parameter), [False] * model.members.count)
        model._marked_by.setdefault(id(parameter), model._installing)
        for slot in slots:
            flags[slot] = True
        if not stacked:
            model._unstacked.add(id(parameter))


def freeze_all_but_trained(model: PeltModel) -> dict[str, str | None]:
    """The one place that decides requires_grad: what some member trains trains, nothing else does. Returns the
    component that marked each parameter some member trains, by name (None: the head, which build_pelt_model marks)."""
    marked_by = {}
    for name, parameter in model.named_parameters():
        flags = model._marked.get(id(parameter))
        parameter.requires_grad_(flags is not None and any(flags))
        if flags is not None:
            model.trains[name] = flags
            if any(flags):
                marked_by[name] = model._marked_by.get(id(parameter))
            if id(parameter) in model._unstacked:
                model.unstacked.add(name)
    model._marked, model._unstacked, model._marked_by = {}, set(), {}
    return marked_by


def check_marks(model: PeltModel, marked_by: dict[str, str | None], alone) -> None:
    """What `mark` was told holds in the model built: a tensor without a member dimension (`stacked=False`) is trained
    only by a component declared `alone` (`alone(component)`: its declaration's reason, or None), whose runs never
    share a backbone; any other has one slot per member. Otherwise the members of a fused group would share one
    tensor, which the optimiser moves through one member only, and their records would silently depend on the group
    (issue 58): ComponentError, naming the component and the tensor."""
    parameters = dict(model.named_parameters())
    for name, component in marked_by.items():
        if component is None:
            continue
        tensor, shape = model.stored_name(name), tuple(parameters[name].shape)
        if name in model.unstacked:
            if not alone(component):
                raise ComponentError(
                    f"component {component} trains {tensor} without a member dimension (mark(..., stacked=False)) "
                    f"but does not declare `alone`: the runs of a fused group would share that one tensor; declare "
                    f"alone=\"<why>\" in its COMPONENT (its runs then always train alone, as fine-tuning's), or give "
                    f"the tensor a member dimension (docs/components.md)")
        elif not shape or shape[0] != model.members.count:
            count = model.members.count
            raise ComponentError(
                f"component {component} marks {tensor} (shape {shape}) as one slot per member (mark's default), but "
                f"its first dimension is not the group's {count} member{'s' if count > 1 else ''}: give it a leading "
                f"member dimension, one slot per member (docs/components.md)")


def ffn_output(model: PeltModel, layer: nn.Module) -> FfnOutput:
    """The layer's FFN block, wrapped (once) so FFN adapters can be added to it (see FfnOutput)."""
    block = get(layer, model.arch.ffn)
    if not isinstance(block, FfnOutput):
        block = FfnOutput(block, model.arch.pre_norm)
        put(layer, model.arch.ffn, block)
    return block


class FfnOutput(nn.Module):
    """Wraps a layer's FFN block and adds the FFN adapters some member uses, each computed on the rows of the members
    that have it and added to those rows only. With h the FFN's output and a its input:

    post-norm (BERT, RoBERTa, ELECTRA, DeBERTa), wrapping the output block (h = dropout(dense(intermediate)), a the
    attention output, the block's residual input, LN the block's own LayerNorm, used twice and frozen):
        out = LN(h + Adapter(LN(h + a)) + ParallelAdapter(a) + a)
    pre-norm (ModernBERT), wrapping the MLP (a = the normalised attention output it reads; the layer adds the
    residual itself, and no LayerNorm follows the block), where AdapterHub places Pfeiffer adapters:
        out = h + Adapter(h + a) + ParallelAdapter(a)
    (AdapterHub adds `a` once more, which changes the pretrained model even at a zero adapter: docs/protocol.md §9.)
    """

    def __init__(self, block: nn.Module, pre_norm: bool) -> None:
        super().__init__()
        self.base = block
        self.pre_norm = pre_norm
        self.adapter: nn.Module | None = None
        self.parallel_adapter: nn.Module | None = None

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            (a,) = inputs
            return self._add_adapters(self.base(a), a, None)
        hidden_states, a = inputs
        norm = self.base.LayerNorm
        return norm(self._add_adapters(self.base.dropout(self.base.dense(hidden_states)), a, norm) + a)

    def _add_adapters(self, h: torch.Tensor, a: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        out = h
        if self.adapter is not None:
            selection = self.adapter.selection(h)
            if selection.count:  # computed on the rows of the members that have it, added to those rows only
                users = self.adapter.members.gather
                x = users(selection, h, view=True) + users(selection, a, view=True)
                if norm is not None:
                    x = norm(x, selection) if isinstance(norm, MemberLayerNorm) else norm(x)
                out = self.adapter.members.add_rows(selection, out, self.adapter(x, selection))
        if self.parallel_adapter is not None:
            selection = self.parallel_adapter.selection(h)
            if selection.count:
                x = self.parallel_adapter.members.gather(selection, a)
                out = self.parallel_adapter.members.add_rows(selection, out, self.parallel_adapter(x, selection))
        return out


class MemberBias(nn.Module):
    """A pretrained Linear whose bias is the member's own for the members that train it (BitFit):
    y = x Wᵀ + b (the pretrained bias, every row), then + (b_m - b) on the rows of a member that trains b_m.
    A Linear without a bias (ModernBERT's) has a bias of zero: BitFit trains it from zero."""

    def __init__(self, members: Members, linear: nn.Linear) -> None:
        super().__init__()
        self.members = members
        self.weight = linear.weight
        bias = linear.bias if linear.bias is not None else torch.zeros(linear.out_features, device=linear.weight.device)
        self.register_buffer("pretrained", bias.detach().clone())
        self.bias = nn.Parameter(bias.detach().unsqueeze(0).repeat(members.count, 1))
        self.users: tuple[int, ...] = ()  # the members that train the bias (set by `mark_users`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.pretrained)
        users = self.members.select(self.users, out.device)
        if not users.count:
            return out
        # b_m - b on every active member's rows, times 0 for a member that does not train it (no gradient reaches
        # its slot), so no row needs picking out
        shift = self.members.pick(self.bias) - self.pretrained
        if not users.every:
            shift = shift * users.flags(out.device)
        shift = shift.to(out.dtype)
        grouped = out.view(shift.shape[0], -1, out.shape[-1])  # a Linear's output: no backward reads it
        return (grouped + shift[:, None]).view(out.shape)


class MemberLayerNorm(nn.Module):
    """A pretrained LayerNorm whose gain and bias are the member's own for the members that train them (LN-tuning,
    BitFit): every row is normalised with the pretrained gain and bias, a member that trains them gets its own.

    A LayerNorm without a bias (ModernBERT's) has a bias of zero, which LN-tuning and BitFit train from zero.

    `selection`: x holds only the selected members' rows (the adapter's input, FfnOutput)."""

    def __init__(self, members: Members, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.members = members
        self.normalized_shape, self.eps = norm.normalized_shape, norm.eps
        bias = norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)
        self.register_buffer("pretrained_weight", norm.weight.detach().clone())
        self.register_buffer("pretrained_bias", bias.detach().clone())
        self.weight = nn.Parameter(norm.weight.detach().unsqueeze(0).repeat(members.count, 1))
        self.bias = nn.Parameter(bias.detach().unsqueeze(0).repeat(members.count, 1))
        self.users: tuple[int, ...] = ()  # the members that train the gain or the bias (set by `mark_users`)

    def forward(self, x: torch.Tensor, selection: Selection | None = None) -> torch.Tensor:
        users = self.members.select(self.users, x.device, within=selection)
        if not users.count:
            return F.layer_norm(x, self.normalized_shape, self.pretrained_weight, self.pretrained_bias, self.eps)
        # the members that train them: normalised, then their own gain and bias
        rows = self.members.gather(users, x, view=True)  # x is saved whole by the pretrained LayerNorm anyway
        mine = F.layer_norm(rows, self.normalized_shape, None, None, self.eps)
        grouped = mine.view(users.count, -1, mine.shape[-1])
        own = torch.addcmul(self.members.slots_of(self.bias, users)[:, None].to(mine.dtype), grouped,
                            self.members.slots_of(self.weight, users)[:, None].to(mine.dtype)).view(mine.shape)
        if users.every:
            return own
        out = F.layer_norm(x, self.normalized_shape, self.pretrained_weight, self.pretrained_bias, self.eps)
        return self.members.replace_rows(users, out, own)


def member_affine(model: PeltModel) -> None:
    """Give every Linear of the pretrained backbone a per-member bias and every LayerNorm a per-member gain and bias
    (once; BitFit and LN-tuning share them, and add their members to `users`)."""
    if getattr(model, "_member_affine", False):
        return
    for parent in list(model.backbone.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(parent, child_name, MemberLayerNorm(model.members, child))
            elif type(child) is nn.Linear:
                setattr(parent, child_name, MemberBias(model.members, child))
    model._member_affine = True
