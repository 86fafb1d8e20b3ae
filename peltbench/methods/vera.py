"""VeRA (Kopiczko et al. 2024, Eq. 3): frozen random A and B shared by every layer, and two trained vectors per
adapted projection:
    y = W x + λ_b ⊙ B(λ_d ⊙ A x)
A: r × in, B: out × r, both kaiming-uniform from a generator seeded with the model seed, exactly as PEFT draws them
from `projection_prng_key` (peft/tuners/vera/model.py: A first, then B, each sized for the largest adapted in / out
and sliced per projection); λ_d = d_initial (r), λ_b = 0 (out). Only λ_d and λ_b train (and count); A and B are
redrawn from the seed. In a fused group each member has its own A and B, drawn from its own model seed.

Gated, the gate multiplies the delta, as UniPELT's gate does LoRA's (VeRA has no constant scale to replace).
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn

from . import lora
from ..component import Component, POSITIVE_INT, PROJECTIONS, Peft, Setting, positive_number, rule
from .base import Members, PeltModel, Selection, mark, rows_for

COMPONENT = Component(
    stage="projection", after=("dora",),  # each delta after the ones peltbench had before it: the order records hold
    settings={
        "vera_rank": Setting(POSITIVE_INT, "VeRA rank r of the shared random A (r × in) and B (out × r)"),
        "vera_targets": Setting(PROJECTIONS, "the projections VeRA adapts, a list from query, key, value"),
        "vera_d_initial": Setting(rule(positive_number, "must be a positive number (λ_d's initial value)"),
                                  "VeRA's initial λ_d (PEFT's d_initial)"),
    },
    gate="the delta λ_b ⊙ B(λ_d ⊙ A x) of each adapted projection: one gate per projection and layer, as LoRA's",
    label="VeRA", arxiv="2310.11454", peft=Peft("VERA"),
)


class SharedProjections(nn.Module):
    """Each VeRA member's frozen A (r × in) and B (out × r), shared by all its layers: buffers with one entry per VeRA
    member (`users`, in slot order; the group's other members hold none), a member with a smaller rank holding zeros
    past it. Not saved: they are drawn again from the model seed."""

    def __init__(self, members: Members, users: tuple[int, ...], rank: int, in_features: int,
                 out_features: int) -> None:
        super().__init__()
        self.users = users
        self.register_buffer("a", torch.zeros(len(users), rank, in_features), persistent=False)
        self.register_buffer("b", torch.zeros(len(users), out_features, rank), persistent=False)
        self._positions: dict = {}

    def of(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Member `slot`'s A and B."""
        index = self.users.index(slot)
        return self.a[index], self.b[index]

    def selected(self, selection: Selection) -> tuple[torch.Tensor, torch.Tensor]:
        """The selected members' A and B, (members, r, in) and (members, out, r)."""
        return rows_for(self.a, self.users, selection, self._positions), \
            rows_for(self.b, self.users, selection, self._positions)

    @torch.no_grad()
    def draw(self, slot: int, rank: int, seed: int) -> None:
        """PEFT's `_init_vera_A_vera_B`: one CPU generator seeded with the key, A then B, kaiming-uniform (gain √2)."""
        generator = torch.Generator(device="cpu").manual_seed(seed)
        a, b = self.of(slot)
        for target, shape in ((a[:rank], (rank, self.a.shape[2])), (b[:, :rank], (self.b.shape[1], rank))):
            bound = math.sqrt(3.0) * math.sqrt(2.0) / math.sqrt(shape[1])
            target.copy_(torch.empty(shape, device="cpu").uniform_(-bound, bound, generator=generator))


class VeRALinear(lora.ProjectionDelta):
    """VeRA's delta on one projection, with the model's `shared` A and B (sliced to this projection's in / out)."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None,
                 shared: SharedProjections) -> None:
        super().__init__(base, members, users, block)
        rank = max(method.vera_rank for method in users.values())
        self.vera_lambda_d = nn.Parameter(torch.zeros(members.count, rank))
        self.vera_lambda_b = nn.Parameter(torch.zeros(members.count, out_features))
        self.shared = shared
        self.in_features = in_features
        self.set_coefficient(users, submodule, layer, in_features, [1.0] * members.count)

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        slots = self.members.slots_of
        rank, size = self.vera_lambda_d.shape[1], self.vera_lambda_b.shape[1]
        a, b = self.shared.selected(selection)
        a = a[:, :rank, : self.in_features].to(rows.dtype)
        b = b[:, :size, :rank].to(rows.dtype)
        grouped = rows.reshape(selection.count, -1, rows.shape[-1])
        hidden = torch.bmm(grouped, a.transpose(1, 2)) * slots(self.vera_lambda_d, selection)[:, None].to(rows.dtype)
        delta = torch.bmm(hidden, b.transpose(1, 2)) * slots(self.vera_lambda_b, selection)[:, None].to(rows.dtype)
        return delta.view(*rows.shape[:-1], size)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """λ_d = d_initial, λ_b = 0 (already), then the gate: PEFT's `reset_vera_parameters`."""
        with torch.no_grad():
            self.vera_lambda_d[slot, : method.vera_rank] = float(method.vera_d_initial)
        self.coefficient.init_member(slot)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    shapes = [lora.projection_shape(model, layer, target) for layer in model.layers for target in lora.TARGETS
              if any(target in method.vera_targets for method in users.values())]
    rank = max(method.vera_rank for method in users.values())
    shared = SharedProjections(model.members, tuple(sorted(users)), rank, max(i for _, i in shapes),
                               max(o for o, _ in shapes))

    def make(base, on_target, target, layer, in_features, out_features, block):
        return VeRALinear(base, model.members, on_target, f"vera_{target}", layer, in_features, out_features, block,
                          shared)

    for vera, on_target in lora.install_deltas(model, users, "vera_targets", make):
        mark(model, [vera.vera_lambda_d, vera.vera_lambda_b], on_target)
        mark(model, vera.coefficient.gate_parameters(), [m for m in on_target if on_target[m].get("gated", False)])


def modules(model: PeltModel, method: DictConfig):
    return lora.delta_modules(model, method.vera_targets, VeRALinear)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """A and B from the model seed, which build_pelt_model has just set (torch.initial_seed() returns it), on their
    own generator: the global stream is untouched, so the gates draw as they would without VeRA."""
    deltas = list(modules(model, method))
    deltas[0].shared.draw(slot, method.vera_rank, torch.initial_seed())
    for vera in deltas:
        vera.init_member(slot, method)


def frozen_state(model: PeltModel, slot: int, method: DictConfig) -> dict[str, torch.Tensor]:
    """What a copy needs beside the trained vectors: the member's A and B at its rank (PEFT's vera_A, vera_B)."""
    a, b = next(modules(model, method)).shared.of(slot)
    return {"vera_A": a[: method.vera_rank].clone(), "vera_B": b[:, : method.vera_rank].clone()}


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.vera_targets) - set(lora.TARGETS))
    if unknown:
        raise ValueError(f"vera_targets: unknown projection(s) {unknown}; choose from {list(lora.TARGETS)}")


def peft_refusal(method: DictConfig, arch) -> str | None:
    """Why a VeRA run has no PEFT copy on this architecture (saving.peft_kind), or None."""
    if lora.fused_targets(arch, method.vera_targets):
        return (f"PEFT's VeRA adapts {arch.name}'s whole fused Wqkv with one λ_d and B for q, k and v; "
                "VeRA on its q and v blocks has no PEFT form (docs/saving.md)")
    return None
