"""RoAd (Liao & Monz 2024, "3-in-1: 2D Rotary Adaptation"), as PEFT 0.21 implements it: each adapted Linear's output
is rotated, pair of features by pair of features, by trained angles θ and scaled by trained magnitudes α:

    h = W x + b,   y_i = c_i · h_i − d_i · h_{i+g/2},   y_{i+g/2} = c_{i+g/2} · h_{i+g/2} + d_{i+g/2} · h_i
within each group of g = `road_group_size` features (element i of a group paired with element i + g/2, PEFT's layout;
g = 2 pairs consecutive features), c = α cos θ and d = α sin θ. `road_variant`: 1 (one θ, α per pair, out/2 of each:
a 2-D rotation scaled by α), 2 (one per feature: out), 4 (two per feature, c = α₁ cos θ₁ and d = α₂ sin θ₂: 2·out),
PEFT's road_1 / road_2 / road_4. θ starts at 0 and α at 1 (PEFT's init_weights), so the model starts as the pretrained
one; nothing is drawn. `road_targets` names the Linears of a layer it adapts (lora.LINEARS: q, k, v, the attention
output, the FFN's two; the paper's GLUE runs adapt all six, "all linear layers", conf/method/road.yaml); where each is
is the architecture map's (ModernBERT's FFN input Linear is its GLU's mlp.Wi, input and gate halves: one Linear to
RoAd, as to PEFT).

On the member dimension the rotation is elementwise on each member's own rows of the projection's output, so the
frozen W x is computed once for the group. Where the architecture map puts a projection in a row block of a fused
Linear (ModernBERT's Wqkv), the block's rows of the output are rotated: exactly RoAd on a separate projection, and, as
RoAd is elementwise, exactly PEFT's RoAd on the whole Wqkv with θ = 0, α = 1 on the other blocks (its PEFT copy).

RoAd multiplies the frozen path: it has no gate (its COMPONENT declares none).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from ..component import Component, Fit, LINEARS, Peft, Setting, choice, positive_int, rule
from . import lora
from .base import Members, PeltModel, mark
from .rotation import replace_rows

COMPONENT = Component(
    stage="projection", after=("c3a",),
    settings={
        "road_variant": Setting(choice(1, 2, 4, must="must be 1, 2 or 4 (PEFT's road_1, road_2, road_4)"),
                                "RoAd's variant: 1, 2 or 4 (PEFT's road_1/2/4: one angle and scale per pair, per "
                                "feature, two per feature)"),
        "road_group_size": Setting(rule(lambda v: positive_int(v) and v % 2 == 0,
                                        "must be a positive even integer (features paired within a group)"),
                                   "RoAd: features are paired within groups of this size (i with i + size/2; 2: "
                                   "consecutive pairs)"),
        "road_targets": Setting(LINEARS, "the Linears of a layer whose output RoAd rotates, a list from query, key, "
                                         "value, attention_output, intermediate, output"),
    },
    fits=(Fit("out_features % road_group_size == 0", targets="road_targets", sides="out",
              why="road_group_size={road_group_size} must divide the output size of every Linear RoAd adapts: "
                  "{target} has {out_features}"),),  # PEFT's rule
    label="RoAd", arxiv="2409.00119", peft=Peft("ROAD"),
)  # no gate: RoAd rotates W x + b itself, nothing additive for a gate to scale
TARGETS = lora.LINEARS  # road_targets: any Linear of a layer
VARIANTS = (1, 2, 4)  # PEFT's road_1, road_2, road_4: parameters per output feature 1/2, 1, 2 (of θ and of α)


def size(method: DictConfig, out_features: int) -> int:
    """How many θ (and α) one member trains on a projection with `out_features` outputs."""
    return out_features * int(method.road_variant) // 2


class RoAdLinear(lora.ProjectionDelta):
    """RoAd on one Linear (or a row block of one) for the members that adapt it: `road_theta`, `road_alpha` (members,
    largest size), PEFT's names and layouts; a member with a smaller size holds its own in the first entries. A
    member's rows of the output (of its `block` in a fused projection) are replaced by their rotation."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None) -> None:
        super().__init__(base, members, users, block)
        for method in users.values():
            why = COMPONENT.misfit(method, out_features=out_features, target=submodule.removeprefix("road_"))
            if why:
                raise ValueError(why)
        largest = max(size(method, out_features) for method in users.values())
        self.road_theta = nn.Parameter(torch.zeros(members.count, largest))
        self.road_alpha = nn.Parameter(torch.ones(members.count, largest))
        kinds: dict[tuple[int, int], list[int]] = {}
        for m in sorted(users):
            kinds.setdefault((int(users[m].road_variant), int(users[m].road_group_size)), []).append(m)
        self.kinds = [(variant, group, size(users[slots[0]], out_features), tuple(slots))
                      for (variant, group), slots in kinds.items()]

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out (the projection's output for x) with the rows of the members that have RoAd here rotated, one batched
        rotation per kind of member (variant, group size) among them."""
        if self.block is not None and self.base is not None:  # another component's delta on the same block
            out = self.base.add(x, out)
        block = self.block or slice(None)
        for variant, group, count, users in self.kinds:
            selection = self.members.select(users, x.device)
            if not selection.count:
                continue
            rows = self.members.gather(selection, out)
            theta = self.members.slots_of(self.road_theta, selection)[:, :count]
            alpha = self.members.slots_of(self.road_alpha, selection)[:, :count]
            h = rows[..., block]
            rotated = apply(variant, group, theta, alpha, h.reshape(selection.count, -1, h.shape[-1]))
            rotated = rotated.to(rows.dtype).view(h.shape)
            if self.block is not None:  # the other blocks' columns as they were
                rotated = torch.cat([rows[..., : block.start], rotated, rows[..., block.stop :]], dim=-1)
            out = replace_rows(self.members, selection, out, rotated)
        return out

    def init_member(self, slot: int, method: DictConfig) -> None:
        """θ = 0, α = 1 (PEFT's init_weights=True): the identity; nothing is drawn."""
        with torch.no_grad():
            self.road_theta[slot].zero_()
            self.road_alpha[slot].fill_(1.0)


def apply(variant: int, group: int, theta: torch.Tensor, alpha: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """PEFT's `_apply_road` for each member's rows h (count, rows, out), in θ's dtype (PEFT casts h to it): h times the
    diagonal factor plus its rotated half (each group's second half, negated, then its first) times the other."""
    first, second = prepare(variant, group, theta, alpha)
    h = h.to(first.dtype)
    pairs = h.reshape(*h.shape[:-1], -1, 2, group // 2)
    half = torch.stack((-pairs[..., 1, :], pairs[..., 0, :]), dim=-2).reshape(h.shape)
    return h * first[:, None] + half * second[:, None]


def prepare(variant: int, group: int, theta: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PEFT's `_prepare_cols` for member-stacked θ, α (count, size) → the (count, out) factors of h and of its rotated
    half: road_1 repeats each group's g/2 values for both halves; road_4 takes cos from the first g values of a group
    and sin from the second (as PEFT)."""
    count = theta.shape[0]
    if variant == 1:
        theta = theta.reshape(count, -1, group // 2).repeat_interleave(2, dim=1).flatten(1)
        alpha = alpha.reshape(count, -1, group // 2).repeat_interleave(2, dim=1).flatten(1)
        return alpha * theta.cos(), alpha * theta.sin()
    if variant == 2:
        return alpha * theta.cos(), alpha * theta.sin()
    theta, alpha = theta.reshape(count, -1, 2, group), alpha.reshape(count, -1, 2, group)
    return alpha[:, :, 0].flatten(1) * theta[:, :, 0].cos().flatten(1), \
        alpha[:, :, 1].flatten(1) * theta[:, :, 1].sin().flatten(1)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    def make(base, on_target, target, layer, in_features, out_features, block):
        return RoAdLinear(base, model.members, on_target, f"road_{target}", layer, in_features, out_features, block)

    for road, on_target in lora.install_deltas(model, users, "road_targets", make):
        mark(model, [road.road_theta, road.road_alpha], on_target)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for road in lora.delta_modules(model, method.road_targets, RoAdLinear):
        road.init_member(slot, method)


def peft_export(tensors: dict[str, torch.Tensor], method: DictConfig, arch) -> tuple[dict, dict[str, torch.Tensor]]:
    """PEFT's RoadConfig and state dict for a run's tensors (saving.export_own adds the head, task and base model).
    `target_modules`: the adapted Linears by full name, as the AdaLoRA export lists them (a suffix such as
    `output.dense` would also name the attention output's). On a fused projection (ModernBERT's Wqkv) one RoAd on the
    whole Linear: each block's θ, α in its place (RoAd's layout keeps a block's groups contiguous), θ = 0 and α = 1 in
    the blocks the run leaves alone."""
    renamed, blocks, modules = {}, {}, []
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        parent, _, target = module.rpartition(".")
        if kind in ("road_theta", "road_alpha") and arch.projections.get(target, (None, None))[1] is not None:
            blocks.setdefault((parent, kind), {})[arch.projections[target][1]] = tensor
            modules.append(parent)
            continue
        renamed[f"base_model.model.{name}"] = tensor
        if kind == "road_theta":
            modules.append(module)
    for (module, kind), parts in blocks.items():
        length = next(iter(parts.values())).numel()
        fill = torch.zeros if kind == "road_theta" else torch.ones
        renamed[f"base_model.model.{module}.{kind}"] = torch.cat(
            [parts.get(block, fill(length)) for block in range(len(arch.projections))])
    config = {"peft_type": "ROAD", "variant": f"road_{int(method.road_variant)}",
              "group_size": int(method.road_group_size), "init_weights": True,
              "target_modules": list(dict.fromkeys(modules))}
    return config, renamed


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.road_targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"road_targets: unknown Linear(s) {unknown}; choose from {list(TARGETS)}")
    if int(method.road_variant) not in VARIANTS:
        raise ValueError(f"road_variant must be one of {list(VARIANTS)} (PEFT's road_1, road_2, road_4)")
