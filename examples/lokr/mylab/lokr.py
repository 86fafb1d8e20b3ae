"""LoKr (Yeh et al., ICLR 2024, arXiv 2309.14859), as PEFT 0.21's LoKrLayer on a Linear: a component written as a
user writes one, outside peltbench (docs/components.md). Each adapted projection's weight change is a Kronecker
product

    ΔW = (α / r) · W1 ⊗ W2,   W1: out_l × in_m,   W2 = W2a W2b (out_k × r, r × in_n), or W2 whole (out_k × in_n)
                                                   where r ≥ max(out_k, in_n) / 2 (PEFT's use_w2)
with out = out_l · out_k and in = in_m · in_n split as PEFT's `factorization(dim, decompose_factor)` splits them.
W1 starts at zero and W2 (or its factors) kaiming-uniform (a = √5), PEFT's init_weights=True, so the model starts as
the pretrained one. PEFT's rank and module dropouts (0 by default) and decompose_both are not taken.

peltbench puts it on the projections (lora.install_deltas: on every encoder, ModernBERT's Wqkv blocks too) for every
member of a fused group that has it; members of one kind (rank, factor) share one delta per projection, each other
kind gets its own, wrapping it.
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn

from peltbench.architectures import unwrapped
from peltbench.component import POSITIVE_INT, POSITIVE_NUMBER, PROJECTIONS, Component, Peft, Setting, positive_int, rule
from peltbench.methods import lora
from peltbench.methods.base import Members, PeltModel, Selection, draw, mark

COMPONENT = Component(
    stage="projection",  # a delta on the projections, as LoRA's (it wraps what is there)
    settings={
        "lokr_rank": Setting(POSITIVE_INT, "LoKr: the rank r of W2's factors (PEFT's r)"),
        "lokr_alpha": Setting(POSITIVE_NUMBER, "LoKr's alpha: ΔW is scaled by alpha / r (PEFT's alpha)"),
        "lokr_factor": Setting(rule(lambda v: v == -1 or positive_int(v), "must be -1 or a positive integer"),
                               "LoKr: how in and out are split (PEFT's decompose_factor; -1: near the square root)",
                               default=-1),
        "lokr_targets": Setting(PROJECTIONS, "the projections LoKr adapts, a list from query, key, value"),
    },
    label="LoKr", arxiv="2309.14859", peft=Peft("LOKR"),
)  # no gate: not a UniPELT submodule


def factorization(dimension: int, factor: int = -1) -> tuple[int, int]:
    """PEFT's split of `dimension` into m ≤ n, m · n = dimension: m = factor where it divides, else the largest
    divisor near the square root (and not above `factor`)."""
    if factor > 0 and dimension % factor == 0:
        return factor, dimension // factor
    factor = dimension if factor == -1 else factor
    m, n = 1, dimension
    while m < n:
        new_m = m + 1
        while dimension % new_m:
            new_m += 1
        new_n = dimension // new_m
        if new_m + new_n > m + n or new_m > factor:
            break
        m, n = new_m, new_n
    return min(m, n), max(m, n)


def kind(method: DictConfig) -> tuple[int, int]:
    """What fixes a member's tensor shapes: its rank and factor."""
    return int(method.lokr_rank), int(method.lokr_factor)


def kaiming(tensor: torch.Tensor) -> torch.Tensor:
    return nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))


class LoKrLinear(lora.ProjectionDelta):
    """LoKr's delta on one projection for the members of one kind: `lokr_w1` (members, out_l, in_m) and `lokr_w2`
    (members, out_k, in_n) or `lokr_w2_a`, `lokr_w2_b` (members, out_k, r), (members, r, in_n): PEFT's names."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None) -> None:
        super().__init__(base, members, users, block)
        [(rank, factor)] = {kind(method) for method in users.values()}  # install: one delta per kind
        (out_l, out_k), (in_m, in_n) = factorization(out_features, factor), factorization(in_features, factor)
        self.lokr_w1 = nn.Parameter(torch.zeros(members.count, out_l, in_m))
        self.whole = rank >= max(out_k, in_n) / 2
        if self.whole:
            self.lokr_w2 = nn.Parameter(torch.zeros(members.count, out_k, in_n))
        else:
            self.lokr_w2_a = nn.Parameter(torch.zeros(members.count, out_k, rank))
            self.lokr_w2_b = nn.Parameter(torch.zeros(members.count, rank, in_n))
        scales = [float(users[m].lokr_alpha) / rank if m in users else 0.0 for m in range(members.count)]
        self.register_buffer("scaling", torch.tensor(scales), persistent=False)
        self.out_features, self.in_features = out_features, in_features
        self.set_coefficient(users, submodule, layer, in_features, [1.0] * members.count)  # α / r is in ΔW

    def trained(self) -> list[nn.Parameter]:
        return [self.lokr_w1, *([self.lokr_w2] if self.whole else [self.lokr_w2_a, self.lokr_w2_b])]

    def weight_change(self, selection: Selection) -> torch.Tensor:
        """(α / r) · W1 ⊗ W2 for the selected members, (members, out, in), in PEFT's order (the product, then α / r)."""
        slots = self.members.slots_of
        w1 = slots(self.lokr_w1, selection)
        w2 = slots(self.lokr_w2, selection) if self.whole else \
            torch.bmm(slots(self.lokr_w2_a, selection), slots(self.lokr_w2_b, selection))
        kron = (w1[:, :, None, :, None] * w2[:, None, :, None, :]).reshape(-1, self.out_features, self.in_features)
        return kron * slots(self.scaling, selection)[:, None, None]

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        change = self.weight_change(selection).to(rows.dtype)
        grouped = rows.reshape(selection.count, -1, rows.shape[-1])
        return torch.bmm(grouped, change.transpose(1, 2)).view(*rows.shape[:-1], -1)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """PEFT's reset_adapter_parameters: W1 zero (already), W2 (W2a, then W2b) kaiming-uniform."""
        for parameter in self.trained()[1:]:
            draw(parameter[slot], kaiming)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    def make(base, on_target, target, layer, in_features, out_features, block):
        return LoKrLinear(base, model.members, on_target, f"lokr_{target}", layer, in_features, out_features, block)

    for same in sorted({kind(method) for method in users.values()}):
        members = {m: method for m, method in users.items() if kind(method) == same}
        for delta, on_target in lora.install_deltas(model, members, "lokr_targets", make):
            mark(model, delta.trained(), on_target)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Layer by layer, q before v: the order PEFT creates (and draws) its LoKr layers in."""
    for layer in model.layers:
        for target in lora.TARGETS:
            if target in method.lokr_targets:
                parent, name, block = lora.site(model, layer, target)
                module = unwrapped(getattr(parent, name))
                module = module if block is None else getattr(module, target)
                while not (type(module) is LoKrLinear and slot in module.users):
                    module = module.base
                module.init_member(slot, method)


def peft_refusal(method: DictConfig, arch) -> str | None:
    """PEFT adapts a fused projection (ModernBERT's Wqkv) whole, with one Kronecker product: not LoKr on its blocks."""
    if lora.fused_targets(arch, method.lokr_targets):
        return f"PEFT's LoKr adapts {arch.name}'s whole fused Wqkv with one Kronecker product; LoKr on its blocks has no PEFT form"
    return None


def peft_export(tensors: dict[str, torch.Tensor], method: DictConfig, arch) -> tuple[dict, dict[str, torch.Tensor]]:
    """PEFT's LoKrConfig and state dict (our tensors are PEFT's, by name; saving.export_own adds the head)."""
    targets = [arch.projections[t][0] for t in lora.TARGETS if t in method.lokr_targets]
    config = {"peft_type": "LOKR", "r": int(method.lokr_rank), "alpha": float(method.lokr_alpha),
              "decompose_factor": int(method.lokr_factor), "decompose_both": False, "rank_dropout": 0.0,
              "module_dropout": 0.0, "init_weights": True, "target_modules": targets}
    return config, {f"base_model.model.{name}": tensor for name, tensor in tensors.items()}
