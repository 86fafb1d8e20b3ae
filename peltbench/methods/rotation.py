"""Rotations of an adapted projection's input (OFT, HRA, BOFT; written once for every orthogonal method):

    y = W (R_mᵀ x)   on the rows of member m,
with R_m the member's own block-diagonal (count, blocks, b, b) matrix (one dense block for HRA, BOFT), built by its
method from its parameters, and W the one frozen projection every member shares (never a copy per member). A row
vector x becomes x R per block, as PEFT's `OFTRotationModule` computes it. Members without a rotation here keep their
rows as they are. BOFT also scales the output: a method with `OUTPUT_SCALE` gets a trained (out, 1) scale s per
member, applied after the shared projection around its frozen bias b: y = b + s ⊙ (W R_mᵀ x) (PEFT's `boft_s`).

A method module (oft.py, hra.py, boft.py) gives `PARAMETER` (the name its tensor takes under the projection, PEFT's),
`shape(method, features)` (one member's parameter shape), `settings(method)` (what else its matrices depend on) and
`matrices(weight, method)` (member-stacked parameters → member-stacked blocks, or a `LowRank` rotation
R = I − U T Uᵀ, HRA's, which is applied to the rows without ever forming R). Members whose shapes and settings agree
are rotated in one batched product; a group mixing block sizes loops over its few distinct kinds. In a forward pass
the matrices of every rotation of the model with the same members, shape and settings are built in one batch.

Where the architecture map puts q, k and v in one fused Linear (ModernBERT's Wqkv), they share its input, so they
share its rotation: targets [query, value] there rotate Wqkv's input once, which k reads too, as PEFT's OFT with
target_modules=["Wqkv"] does (PEFT cannot rotate part of a Linear's input, nor can anything that keeps W shared and
one product per Linear). The count is then one rotation per layer where BERT has two (docs/protocol.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from omegaconf import DictConfig
from torch import nn

from .base import Members, PeltModel, mark

TARGETS = ("query", "key", "value")  # the attention projections a rotation may adapt (where: architectures.py)


class InputRotation(nn.Module):
    """One method's rotation of one projection's input, for the members (`users`) that adapt it.

    `weight`: (members, *largest member's shape), zero-padded past each member's own shape; `scale` (BOFT's s):
    (members, out, 1). Keeps the method's `matrices` function, not its module (a model stays deep-copyable)."""

    def __init__(self, members: Members, users: dict[int, DictConfig], kind, features: int, outputs: int = 0) -> None:
        super().__init__()
        self.members = members
        self.matrices = kind.matrices
        self.users = tuple(sorted(users))
        shapes = {m: tuple(kind.shape(method, features)) for m, method in users.items()}
        largest = tuple(max(sizes) for sizes in zip(*shapes.values()))
        self.weight = nn.Parameter(torch.zeros(members.count, *largest))
        if getattr(kind, "OUTPUT_SCALE", None):  # BOFT's s: (members, out, 1), ones
            self.scale = nn.Parameter(torch.ones(members.count, outputs, 1))
        groups: dict[tuple, list[int]] = {}
        for m in sorted(users):
            groups.setdefault((shapes[m], kind.settings(users[m])), []).append(m)
        self.groups = [(tuple(slots), shape, users[slots[0]], settings) for (shape, settings), slots in groups.items()]
        self.siblings: list[InputRotation] = [self]  # the model's rotations of this method (install): built together

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, (users, _, _, _) in enumerate(self.groups):
            selection = self.members.select(users, x.device)
            if not selection.count:
                continue
            blocks = self.blocks(index, selection)
            rows = self.members.gather(selection, x)
            rotated = rotate(rows, cast(blocks, rows.dtype), selection.count)
            x = replace_rows(self.members, selection, x, rotated)
        return x

    def weights(self, index: int, selection) -> torch.Tensor:
        """The selected members' parameters of a group, cut to its shape."""
        shape = self.groups[index][1]
        return self.members.slots_of(self.weight, selection)[(slice(None), *(slice(0, n) for n in shape))]

    def blocks(self, index: int, selection) -> torch.Tensor:
        """The selected members' rotation blocks of a group. In a model's forward pass (Members.per_pass) they are
        built once for every rotation of the model with the same members, shape and settings (each layer's q, v ...):
        one batched `matrices` over all of them, the first time one is needed."""
        users, shape, method, settings = self.groups[index]
        cache = self.members.per_pass
        if cache is None:
            return self.matrices(self.weights(index, selection), method)
        if (id(self), index) not in cache:
            same = [(sibling, i) for sibling in self.siblings for i, group in enumerate(sibling.groups)
                    if (group[0], group[1], group[3]) == (users, shape, settings)]
            if len(same) == 1:
                cache[(id(self), index)] = self.matrices(self.weights(index, selection), method)
            else:
                weights = torch.stack([sibling.weights(i, selection) for sibling, i in same])
                blocks = self.matrices(weights.flatten(0, 1), method)
                parts = [part.unflatten(0, (len(same), selection.count)).unbind(0) for part in
                         (blocks if isinstance(blocks, LowRank) else (blocks,))]
                for (sibling, i), matrices in zip(same, zip(*parts)):
                    cache[(id(sibling), i)] = LowRank(*matrices) if isinstance(blocks, LowRank) else matrices[0]
        return cache[(id(self), index)]

    def scale_output(self, out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """bias + s_m ⊙ (out − bias) on the rows of the members that have a scale here."""
        selection = self.members.select(self.users, out.device)
        if not selection.count:
            return out
        rows = self.members.gather(selection, out)
        scale = self.members.slots_of(self.scale, selection)[:, None, :, 0].to(rows.dtype)  # (count, 1, out)
        grouped = rows.reshape(selection.count, -1, rows.shape[-1])
        scaled = grouped * scale if bias is None else bias + (grouped - bias) * scale
        return replace_rows(self.members, selection, out, scaled.reshape(rows.shape))


class LowRank(NamedTuple):
    """A rotation R = I − U T Uᵀ (count, in, r) and (count, r, r): r Householder reflections in compact WY form (HRA).
    x Rᵀ = x − ((x U) Tᵀ) Uᵀ costs 4·in·r per row, and no in × in matrix is ever formed or kept."""

    u: torch.Tensor
    t: torch.Tensor


def cast(blocks, dtype: torch.dtype):
    return LowRank(blocks.u.to(dtype), blocks.t.to(dtype)) if isinstance(blocks, LowRank) else blocks.to(dtype)


def rotate(rows: torch.Tensor, blocks, count: int) -> torch.Tensor:
    """x R for each member's rows, block by block: rows (count · n, ..., features), blocks (count, r, b, b). One
    dense block (BOFT): one bmm; r blocks (OFT): one batched matmul over members and blocks; a LowRank R (HRA):
    three thin products."""
    if isinstance(blocks, LowRank):
        grouped = rows.reshape(count, -1, rows.shape[-1])
        mixed = torch.bmm(torch.bmm(grouped, blocks.u), blocks.t.transpose(1, 2))
        return (grouped - torch.bmm(mixed, blocks.u.transpose(1, 2))).view(rows.shape)
    members, r, b, _ = blocks.shape
    if r == 1:
        return torch.bmm(rows.reshape(count, -1, b), blocks.view(count, b, b)).view(rows.shape)
    grouped = rows.reshape(count, -1, r, b).transpose(1, 2)  # (count, r, rows · tokens, b)
    return torch.matmul(grouped, blocks).transpose(1, 2).reshape(rows.shape)


def replace_rows(members: Members, selection, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x with the selected members' rows replaced (out of place: x is a layer's input, which backward may read); under
    autocast the rotated rows (a bf16 matmul's) take x's dtype, which the projection autocasts again."""
    return members.replace_rows(selection, x, rows)


def install(model: PeltModel, users: dict[int, DictConfig], kind, component: str) -> None:
    """Put `kind`'s rotation on the input of each Linear computing a projection some member targets, in every layer
    (under the name `kind.PARAMETER` in that module, with a pre-hook that rotates what the module receives). A fused
    Linear (ModernBERT's Wqkv) is rotated once for a member that targets any of its blocks: they share its input."""
    linears: dict[str, list[str]] = {}
    for target in TARGETS:
        linears.setdefault(model.arch.projections[target][0], []).append(target)
    made = []
    for layer in model.layers:
        attention = model.attention(layer)
        for name, blocks in linears.items():
            on_linear = {m: method for m, method in users.items()
                         if set(blocks) & set(method[f"{component}_targets"])}
            if not on_linear:
                continue
            projection = getattr(attention, name)
            weighted = _weighted(projection)
            rotation = InputRotation(model.members, on_linear, kind, weighted.weight.shape[1], weighted.weight.shape[0])
            projection.add_module(kind.PARAMETER, rotation)
            if not getattr(projection, "_rotates_input", False):  # one pair of hooks for every method's rotation here
                projection.register_forward_pre_hook(_rotate_input)
                projection.register_forward_hook(_scale_output)
                projection._rotates_input = True
            mark(model, rotation, on_linear)
            made.append(rotation)
    for rotation in made:
        rotation.siblings = made


def member_rotations(model: PeltModel, parameter: str, slot: int) -> list[InputRotation]:
    """The rotations named `parameter` that member `slot` uses, in model order (the order a separate run builds
    them: layer after layer, then the attention module's projections)."""
    return [module for name, module in model.named_modules()
            if isinstance(module, InputRotation) and name.endswith(parameter) and slot in module.users]


def _weighted(module: nn.Module) -> nn.Module:
    """The module holding a projection's frozen weight under peltbench's wrappers (LoRA's `base`; BitFit's
    MemberBias holds it itself)."""
    while not hasattr(module, "weight"):
        module = module.base
    return module


def _frozen_bias(module: nn.Module) -> torch.Tensor | None:
    weighted = _weighted(module)
    return getattr(weighted, "pretrained", weighted.bias)  # MemberBias keeps the pretrained bias as `pretrained`


def _rotate_input(module: nn.Module, args: tuple) -> tuple:
    rotations = [child for child in module.children() if isinstance(child, InputRotation)]
    x = rotations[0].members.funnel(args[0])  # the projection's terms of x's gradient summed as alone (base.py)
    for rotation in rotations:  # one per method on this projection, in COMPONENTS order
        x = rotation(x)
    return (x, *args[1:])


def _scale_output(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    for child in module.children():
        if isinstance(child, InputRotation) and hasattr(child, "scale"):
            out = child.scale_output(out, _frozen_bias(module))
    return out


def check(method: DictConfig, component: str) -> None:
    unknown = sorted(set(method[f"{component}_targets"]) - set(TARGETS))
    if unknown:
        raise ValueError(f"{component}_targets: unknown projection(s) {unknown}; choose from {list(TARGETS)}")
