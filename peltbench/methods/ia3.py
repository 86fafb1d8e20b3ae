"""(IA)³ (Liu et al. 2022, "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than In-Context
Learning", §3.3): learned vectors rescale the keys, the values and the FFN's inner activation of every layer.

    K' = l_k ⊙ K,   V' = l_v ⊙ V,   FFN(x) = W_2 (l_ff ⊙ γ(W_1 x))        l_k, l_v: H;  l_ff: the FFN's inner width
All start at 1, so the model starts as the pretrained one. K and V include their projections' biases (PEFT scales
the output of the key and value Linear); l_ff scales the input of the FFN's second Linear (PEFT's
`feedforward_modules`; ModernBERT: the GLU's output, the input of `mlp.Wo`). Only the paper's three places: PEFT's
default roberta/bert mapping also matches `attention.output.dense` (suffix `output.dense`) and scales a fourth.

Where the places are is the architecture map's (architectures.py: the key/value projections, ModernBERT's as row
blocks of the fused Wqkv, and `ffn_linear`). A scale wraps whatever sits at the place (the pretrained Linear, or a
LoRA or BitFit wrapper installed before it), keeping it as `inner`. Member dimension: each member's scales in its own
slot, 1 in the slots of members without (IA)³, so every active row is multiplied by its member's vector.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from ..architectures import get
from ..component import Component, Peft
from .base import Members, PeltModel, mark
from .lora import frozen_linear

COMPONENT = Component(
    stage="scale",  # after every projection delta and rotation: its scales wrap what sits at a projection
    label="(IA)³", arxiv="2205.05638", peft=Peft("IA3"),
)  # no gate: a scale has no additive contribution to the frozen path for a gate to multiply
TARGETS = ("key", "value")  # the attention projections whose outputs are scaled (the paper's l_k, l_v)


class Scale(nn.Module):
    """One (IA)³ vector per member: `ia3_l` (members, size), 1 where a member has none."""

    def __init__(self, members: Members, size: int, device: torch.device) -> None:
        super().__init__()
        self.members = members
        self.ia3_l = nn.Parameter(torch.ones(members.count, size, device=device))
        self.users: tuple[int, ...] = ()  # the members with (IA)³ (install)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x (active members' rows, ..., size) times each row's member's vector."""
        return scaled(self.members, self.users, x, lambda selection: self.members.slots_of(self.ia3_l, selection))

    def init_member(self, slot: int) -> None:
        with torch.no_grad():
            self.ia3_l[slot].fill_(1.0)


def scaled(members: Members, users: tuple[int, ...], x: torch.Tensor, vectors) -> torch.Tensor:
    """x (active members' rows, ..., size) with the rows of `users` times their member's vector (`vectors(selection)`:
    (selected members, size)); only their rows are multiplied, so only theirs are kept for the backward pass."""
    selection = members.select(users, x.device)
    if not selection.count:
        return x
    rows = members.gather(selection, x)
    scale = vectors(selection).to(x.dtype)
    grouped = rows.view(selection.count, -1, x.shape[-1])
    return members.replace_rows(selection, x, (grouped * scale[:, None]).view(rows.shape))


class ScaledOutput(Scale):
    """A projection whose output is scaled per member: y = l ⊙ (W x + b)."""

    def __init__(self, inner: nn.Module, members: Members, size: int, device: torch.device) -> None:
        super().__init__(members, size, device)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(self.inner(x))


class ScaledBlocks(nn.Module):
    """A fused projection (ModernBERT's Wqkv = [W_q; W_k; W_v]) with some of its row blocks scaled: each block's
    vector (a Scale registered under its target's name) multiplies its rows of the output, the others keep 1."""

    def __init__(self, inner: nn.Module, members: Members, blocks: int) -> None:
        super().__init__()
        self.inner = inner
        self.members = members
        self.blocks = blocks
        self.targets: dict[int, str] = {}  # block → target name (its Scale is an attribute of that name)

    def add_target(self, target: str, block: int, scale: Scale) -> None:
        self.add_module(target, scale)
        self.targets[block] = target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        size = out.shape[-1] // self.blocks
        users = getattr(self, next(iter(self.targets.values()))).users

        def vectors(selection):
            return torch.cat([self.members.slots_of(getattr(self, self.targets[b]).ia3_l, selection)
                              if b in self.targets else out.new_ones(selection.count, size)
                              for b in range(self.blocks)], dim=-1)
        return scaled(self.members, users, out, vectors)


class ScaledInput(Scale):
    """The FFN's second Linear with its input scaled per member: y = W (l ⊙ x) + b."""

    def __init__(self, inner: nn.Module, members: Members, size: int, device: torch.device) -> None:
        super().__init__(members, size, device)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.rows(x))


def ffn_block(model: PeltModel, layer: nn.Module) -> nn.Module:
    """The layer's own FFN block (`arch.ffn`), under the FFN adapters' wrapper (base.FfnOutput keeps it as `base`)."""
    from .base import FfnOutput

    block = get(layer, model.arch.ffn)
    return block.base if isinstance(block, FfnOutput) else block


def _features(module: nn.Module) -> tuple[int, int]:
    """(out, in) of a Linear, under any wrapper that keeps it as `inner` or `base` (LoRA, BitFit)."""
    return tuple(frozen_linear(module).weight.shape)


def scales(model: PeltModel, layer: nn.Module) -> dict[str, Scale]:
    """A layer's (IA)³ vectors by place: key, value, ffn."""
    attention = model.attention(layer)
    found = {}
    for target in TARGETS:
        name, block = model.arch.projections[target]
        module = getattr(attention, name)
        found[target] = getattr(module, target) if block is not None else module
    found["ffn"] = getattr(ffn_block(model, layer), model.arch.ffn_linear)
    return found


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    members, device = model.members, next(model.backbone.parameters()).device
    for layer in model.layers:
        attention = model.attention(layer)
        for target in TARGETS:
            name, block = model.arch.projections[target]
            projection = getattr(attention, name)
            if block is None:
                setattr(attention, name, ScaledOutput(projection, members, _features(projection)[0], device))
                continue
            if not isinstance(projection, ScaledBlocks):
                projection = ScaledBlocks(projection, members, len(model.arch.projections))
                setattr(attention, name, projection)
            size = _features(projection.inner)[0] // projection.blocks
            projection.add_target(target, block, Scale(members, size, device))
        ffn = ffn_block(model, layer)
        linear = getattr(ffn, model.arch.ffn_linear)
        setattr(ffn, model.arch.ffn_linear, ScaledInput(linear, members, _features(linear)[1], device))
        for scale in scales(model, layer).values():
            mark(model, [scale.ia3_l], users)
            scale.users = tuple(sorted(users))


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Every vector at 1 (the paper's and PEFT's init): nothing is drawn."""
    for layer in model.layers:
        for scale in scales(model, layer).values():
            scale.init_member(slot)
