"""DeLoRA (Bini, Girrbach & Akata, ICLR 2025, "Decoupling Angles and Strength in Low-rank Adaptation"), as PEFT 0.21
implements it: a low-rank update whose directions are normalised and whose strength is one trained scalar λ,

    y = W x + b + B Ξ A (‖W‖_c ⊙ x),    Ξ = diag(λ / r / (‖a_i‖ · ‖b_i‖))
a_i the rows of A (r × in), b_i the columns of B (out × r), each norm clamped below at 1e-4 as PEFT's; ‖W‖_c the
norm of each of W's columns (fixed at the start: PEFT's `delora_w_norm`). So ‖ΔW‖ ≤ λ‖W‖ whatever A and B learn. A is
kaiming-uniform (a = √5), B zeros, λ = `delora_lambda`; A, B and λ train (r·(in + out) + 1 per projection). PEFT's
`module_dropout` (dropout on x before A, 0 by default) is not taken: no dropout, as our LoRA.

Written as LoRA's delta on a projection (lora.ProjectionDelta): a fused group shares W x and each member adds its own
update on its own rows. On a row block of a fused Linear (ModernBERT's Wqkv) the update and ‖W‖_c are the block's, so
it is exactly DeLoRA on a separate projection; PEFT can only adapt the whole Wqkv (one λ, one ‖W‖_c over its 3H rows),
which is not that, so no PEFT copy is written there (saving.peft_kind). No gate: λ is DeLoRA's own strength.
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn

from . import lora
from ..component import Component, POSITIVE_INT, PROJECTIONS, Peft, Setting, positive_number, rank_fit, rule
from .base import Members, PeltModel, Selection, draw, mark

COMPONENT = Component(
    stage="projection", after=("road",),
    settings={
        "delora_rank": Setting(POSITIVE_INT, "DeLoRA rank r"),
        "delora_lambda": Setting(rule(positive_number, "must be a positive number (λ, the bound on the update's norm "
                                                       "relative to W's)"),
                                 "DeLoRA's initial λ, the trained bound on the update's norm relative to W's"),
        "delora_targets": Setting(PROJECTIONS, "the projections DeLoRA adapts, a list from query, key, value"),
    },
    fits=(rank_fit("delora_rank", "delora_targets"),),
    label="DeLoRA", arxiv="2503.18225", peft=Peft("DELORA"),
)  # no gate: λ is the update's own learned strength; DeLoRA's paper and PEFT have no gate
NORM_FLOOR = 1e-4  # PEFT's clamp of ‖a_i‖ and ‖b_i‖ (a zero B at the start)


class DeLoRALinear(lora.ProjectionDelta):
    """DeLoRA's delta on one projection: `delora_A` (members, r, in), `delora_B` (members, out, r), `delora_lambda`
    (members, 1), PEFT's names; `w_norm` (in,) the frozen column norms of this delta's rows of W, shared by every
    member (W is). Members with a smaller rank hold zeros past it (their Ξ there multiplies zeros)."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None, linear: nn.Module) -> None:
        super().__init__(base, members, users, block)
        rank = max(int(method.delora_rank) for method in users.values())
        self.delora_A = nn.Parameter(torch.zeros(members.count, rank, in_features))
        self.delora_B = nn.Parameter(torch.zeros(members.count, out_features, rank))
        self.delora_lambda = nn.Parameter(torch.zeros(members.count, 1))
        self.set_coefficient(users, submodule, layer, in_features, [1.0] * members.count)  # ungated: nothing
        ranks = [float(users[m].delora_rank) if m in users else 1.0 for m in range(members.count)]
        self.register_buffer("ranks", torch.tensor(ranks, device=linear.weight.device), persistent=False)
        with torch.no_grad():  # PEFT's delora_w_norm: ‖W‖ over the output dimension, per input column
            self.register_buffer("w_norm", torch.linalg.norm(linear.weight[block or slice(None)], dim=0),
                                 persistent=False)

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        """PEFT's decomposed forward: h = (x ⊙ ‖W‖_c) Aᵀ, h ⊙ Ξ, then h Bᵀ, for each selected member's rows."""
        slots = self.members.slots_of
        a, b = slots(self.delora_A, selection), slots(self.delora_B, selection)
        norms = a.norm(dim=2).clamp(min=NORM_FLOOR) * b.norm(dim=1).clamp(min=NORM_FLOOR)       # (members, r)
        scaling = slots(self.delora_lambda, selection) / slots(self.ranks, selection)[:, None] / norms
        grouped = (rows * self.w_norm).reshape(selection.count, -1, rows.shape[-1])
        h = torch.bmm(grouped, a.transpose(1, 2)) * scaling[:, None]
        return torch.bmm(h, b.transpose(1, 2)).to(out.dtype).view(*rows.shape[:-1], -1)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """PEFT's reset_delora_parameters: A kaiming-uniform (a = √5), B zeros (already), λ = delora_lambda."""
        draw(self.delora_A[slot, : int(method.delora_rank)], lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)))
        with torch.no_grad():
            self.delora_lambda[slot] = float(method.delora_lambda)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    def make(base, on_target, target, layer, in_features, out_features, block):
        linear = lora.frozen_projection(model, model.layers[layer], target)
        return DeLoRALinear(base, model.members, on_target, f"delora_{target}", layer, in_features, out_features,
                            block, linear)

    for delora, on_target in lora.install_deltas(model, users, "delora_targets", make):
        mark(model, [delora.delora_A, delora.delora_B, delora.delora_lambda], on_target)


def modules(model: PeltModel, method: DictConfig):
    return lora.delta_modules(model, method.delora_targets, DeLoRALinear)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for delora in modules(model, method):
        delora.init_member(slot, method)


def frozen_state(model: PeltModel, slot: int, method: DictConfig) -> dict[str, torch.Tensor]:
    """PEFT's `delora_w_norm` of each adapted projection (computed again from W when a run is rebuilt)."""
    return {model.stored_name(f"{name}.delora_w_norm"): module.w_norm for name, module in model.named_modules()
            if isinstance(module, DeLoRALinear) and slot in module.users}


def peft_export(tensors: dict[str, torch.Tensor], method: DictConfig, arch) -> tuple[dict, dict[str, torch.Tensor]]:
    """PEFT's DeloraConfig and state dict (saving.export_own adds the head, task and base model): our tensors under
    PEFT's names, λ as (1,), the column norms as `delora_w_norm` (PEFT saves that buffer)."""
    targets = [t for t in lora.TARGETS if t in method.delora_targets]
    config = {"peft_type": "DELORA", "r": int(method.delora_rank), "delora_lambda": float(method.delora_lambda),
              "module_dropout": 0.0, "bias": "none", "init_weights": True,
              "target_modules": list(dict.fromkeys(arch.projections[t][0] for t in targets))}
    return config, {f"base_model.model.{name}": tensor.reshape(1) if name.endswith(".delora_lambda") else tensor
                    for name, tensor in tensors.items()}


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.delora_targets) - set(lora.TARGETS))
    if unknown:
        raise ValueError(f"delora_targets: unknown projection(s) {unknown}; choose from {list(lora.TARGETS)}")


def peft_refusal(method: DictConfig, arch) -> str | None:
    """Why a DeLoRA run has no PEFT copy on this architecture (saving.peft_kind), or None."""
    if lora.fused_targets(arch, method.delora_targets):
        return (f"PEFT's DeLoRA adapts {arch.name}'s whole fused Wqkv with one λ and W's column norms over its "
                "q, k and v rows; DeLoRA on its q and v blocks has no PEFT form (docs/saving.md)")
    return None
