"""AdaLoRA (Zhang et al. 2023): an update in SVD form whose rank budget is allocated by importance, as PEFT 0.21 has it.

    y = W x + (α / r₀) · P Λ Q x            (PEFT: lora_B (out × r₀), lora_E (r₀ × 1), lora_A (r₀ × in), ranknum r₀)
Q and P start N(0, 0.02), Λ at zero; r₀ is the initial rank, and α / r₀ stays the scale while triplets are masked
(PEFT never changes ranknum). The loss gains γ · mean over the adapted matrices of ‖QQᵀ − I‖_F and ‖PᵀP − I‖_F
(PEFT: the Frobenius norm itself, averaged over the 2 × matrices; the paper writes the sum of squared norms).
The budget schedule (plan, after_step) and the regulariser are in adalora_budget.py. Each member of a fused group has
its own Q, Λ, P slots, its own schedule and its own budget over its own triplets.
On a fused projection (ModernBERT's Wqkv) the q, k, v blocks are adapted as separate matrices, as LoRA's are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from ..architectures import unwrapped
from ..component import Check, Component, FRACTION, LAYER_LINEARS, NON_NEGATIVE_NUMBER, OPEN_UNIT, POSITIVE_INT, POSITIVE_NUMBER, Peft, Setting, distinct, non_negative_int, rank_fit, rule
from .base import Coefficient, Members, PeltModel, draw, mark, scale_grouped
from .lora import FusedProjection, frozen_linear, site

# The matrices AdaLoRA may adapt: q, k, v (architectures.projections) and the attention output and FFN Linears
# (architectures.dense). The paper adapts all six (§5.1; the official GLUE scripts' lora_module list).
ATTENTION = ("query", "key", "value")
TARGETS = (*ATTENTION, "attention_output", "intermediate", "output")
COMPONENT = Component(
    stage="projection", after=("delora",),
    settings={
        "adalora_targets": Setting(distinct(LAYER_LINEARS, "matrices"), "the matrices AdaLoRA adapts: query key value "
                                                                         "attention_output intermediate output"),
        "adalora_init_rank": Setting(POSITIVE_INT, "AdaLoRA's initial rank r0 of every matrix (the initial budget)"),
        "adalora_target_rank": Setting(rule(non_negative_int, "must be a non-negative integer (the average final "
                                                              "rank)"),
                                       "AdaLoRA's average final rank (the final budget)"),
        "adalora_alpha": Setting(POSITIVE_NUMBER, "AdaLoRA's alpha: the update is scaled by alpha / r0"),
        "adalora_tinit": Setting(FRACTION, "AdaLoRA's warm-up before any masking, a fraction of the run's planned "
                                           "steps"),
        "adalora_tfinal": Setting(FRACTION, "AdaLoRA's final phase at the target budget, a fraction of the planned "
                                            "steps"),
        "adalora_delta_t": Setting(POSITIVE_INT, "AdaLoRA masks every this many steps while the budget shrinks"),
        "adalora_beta1": Setting(OPEN_UNIT, "AdaLoRA's EMA of the sensitivity"),
        "adalora_beta2": Setting(OPEN_UNIT, "AdaLoRA's EMA of the uncertainty"),
        "adalora_orth_reg": Setting(NON_NEGATIVE_NUMBER, "AdaLoRA's orthogonal regulariser weight gamma"),
    },
    gate="the update (α/r₀)·PΛQx of each adapted matrix: gated, the gate replaces α/r₀ (as LoRA's gate replaces s)",
    checks=(  # PEFT's AdaLoraConfig refuses the same
        Check("adalora_target_rank < adalora_init_rank",
              "method.adalora_target_rank={adalora_target_rank}: must be below adalora_init_rank ({adalora_init_rank}), "
              "or there is no budget to allocate (that is method=lora)"),
        Check("adalora_tinit + adalora_tfinal < 1",
              "method.adalora_tinit + adalora_tfinal = {adalora_tinit + adalora_tfinal}: must be below 1 (fractions of "
              "the run's steps), to leave a budgeting phase"),
    ),
    schedule=(  # adalora_budget.py plans the same rounding
        Check("round(float(adalora_tinit) * steps) < steps - round(float(adalora_tfinal) * steps)",
              "{steps} training steps leave no budgeting phase after tinit {adalora_tinit} and before tfinal "
              "{adalora_tfinal} (of the steps): lower them or train longer"),
    ),
    fits=(rank_fit("adalora_init_rank", "adalora_targets"),),
    label="AdaLoRA", arxiv="2303.10512", peft=Peft("ADALORA"),
)
INIT_STD = 0.02  # PEFT's reset_lora_parameters: P and Q N(0, 0.02), Λ zeros


class SVDLinear(nn.Module):
    """Wraps one Linear W (`base`) and adds (α/r₀) · P Λ Q x for the rows of the members that adapt it. Members with
    a smaller r₀ than the group's largest hold zeros past their rank; `rank_mask` (members, rank) marks their own
    triplets. Inside a fused projection (FusedProjection) it has no base and adds to its row `block`."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None = None) -> None:
        super().__init__()
        self.base = base
        self.block = block
        self.members = members
        self.users = tuple(sorted(users))
        rank = max(int(method.adalora_init_rank) for method in users.values())
        self.lora_A = nn.Parameter(torch.zeros(members.count, rank, in_features))
        self.lora_E = nn.Parameter(torch.zeros(members.count, rank, 1))
        self.lora_B = nn.Parameter(torch.zeros(members.count, out_features, rank))
        ranks = [int(users[m].adalora_init_rank) if m in users else 0 for m in range(members.count)]
        self.register_buffer("rank_mask", torch.arange(rank)[None, :] < torch.tensor(ranks)[:, None], persistent=False)
        gated = [bool(users[m].gated) if m in users else False for m in range(members.count)]
        scales = [_scale(users[m]) if m in users else 1.0 for m in range(members.count)]
        self.coefficient = Coefficient(members, in_features, submodule, layer, gated, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, self.base(x))

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out (the Linear's output for x) plus this update, on the rows of the members that have it."""
        selection = self.members.select(self.users, x.device)
        if not selection.count:
            return out
        rows = self.members.gather(selection, x)
        slots = self.members.slots_of
        scaled_a = slots(self.lora_A, selection) * slots(self.lora_E, selection)  # PEFT: lora_A * lora_E
        grouped = rows.reshape(selection.count, -1, rows.shape[-1])
        delta = torch.bmm(torch.bmm(grouped, scaled_a.transpose(1, 2)), slots(self.lora_B, selection).transpose(1, 2))
        coefficient = self.coefficient(rows, selection)
        if coefficient is not None:
            delta = scale_grouped(delta, coefficient)
        delta = delta.view(*rows.shape[:-1], -1)
        if self.block is not None:
            delta = F.pad(delta, (self.block.start, out.shape[-1] - self.block.stop))
        return self.members.add_rows(selection, out, delta)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """Q, then P, each N(0, 0.02) on the member's own rank (Λ stays zero), then the gate."""
        rank = int(method.adalora_init_rank)
        draw(self.lora_A[slot, :rank], lambda t: nn.init.normal_(t, std=INIT_STD))
        draw(self.lora_B[slot, :, :rank], lambda t: nn.init.normal_(t, std=INIT_STD))
        self.coefficient.init_member(slot)

    def triplets(self) -> list[nn.Parameter]:
        return [self.lora_A, self.lora_E, self.lora_B]


def _scale(method: DictConfig) -> float:
    """PEFT's scaling / ranknum: α / (r₀ + 1e-5) (α ≤ 0 means α = r₀, as PEFT)."""
    rank = int(method.adalora_init_rank)
    alpha = float(method.adalora_alpha)
    return (alpha if alpha > 0 else float(rank)) / (rank + 1e-5)


def _weight(linear: nn.Module) -> torch.Tensor:
    """The frozen weight of a Linear, under the wrappers other components put on it (LoRA's, BitFit's bias)."""
    return frozen_linear(linear).weight


def _under(module: nn.Module) -> nn.Module:
    """What a wrapper wraps: (IA)³'s scale keeps it as `inner`, LoRA's and the others' as `base`."""
    return module.inner if "inner" in module._modules else module.base


def adalora_module(model: PeltModel, layer: nn.Module, target: str) -> SVDLinear:
    parent, name, block = site(model, layer, target)
    module = getattr(parent, name)
    if block is not None:
        return getattr(unwrapped(module), f"adalora_{target}")
    while not isinstance(module, SVDLinear):  # it wraps the Linear itself, under any other wrapper
        module = _under(module)
    return module


def _targets(users: dict[int, DictConfig]) -> list[str]:
    return [t for t in TARGETS if any(t in method.adalora_targets for method in users.values())]


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    from .adalora_budget import Budget

    modules = []
    for index, layer in enumerate(model.layers):
        for target in _targets(users):
            on_target = {m: method for m, method in users.items() if target in method.adalora_targets}
            parent, name, block = site(model, layer, target)
            linear = getattr(parent, name)
            while block is None and isinstance(getattr(linear, "base", None), nn.Module):  # under LoRA's wrapper
                parent, name, linear = linear, "base", linear.base
            if block is None:
                out_features, in_features = _weight(linear).shape
                module = SVDLinear(linear, model.members, on_target, f"adalora_{target}", index, in_features,
                                   out_features)
                setattr(parent, name, module)
            else:
                if not isinstance(linear, FusedProjection):
                    linear = FusedProjection(linear)
                    setattr(parent, name, linear)
                out_features, in_features = _weight(linear).shape
                size = out_features // len(ATTENTION)
                module = SVDLinear(None, model.members, on_target, f"adalora_{target}", index, in_features, size,
                                   slice(block * size, (block + 1) * size))
                linear.add_target(f"adalora_{target}", module)
            mark(model, module.triplets(), on_target)
            mark(model, module.coefficient.gate_parameters(), [m for m in on_target if on_target[m].gated])
            modules.append(module)
    model.adalora = Budget(modules, users, model.members.count)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for layer in model.layers:
        for target in TARGETS:
            if target in method.adalora_targets:
                adalora_module(model, layer, target).init_member(slot, method)


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.adalora_targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"adalora_targets: unknown matrix/matrices {unknown}; choose from {list(TARGETS)}")
    if not 0 <= int(method.adalora_target_rank) < int(method.adalora_init_rank):
        raise ValueError(f"adalora_target_rank ({method.adalora_target_rank}) must be below adalora_init_rank "
                         f"({method.adalora_init_rank}): there is no budget to allocate otherwise (use lora)")
    if not (0 <= float(method.adalora_tinit) and 0 <= float(method.adalora_tfinal)
            and float(method.adalora_tinit) + float(method.adalora_tfinal) < 1):
        raise ValueError("adalora_tinit and adalora_tfinal are fractions of the run's steps, and their sum must be "
                         f"below 1 to leave a budgeting phase (not {method.adalora_tinit} + {method.adalora_tfinal})")
    if int(method.adalora_delta_t) < 1:
        raise ValueError(f"adalora_delta_t must be at least 1 step, not {method.adalora_delta_t}")
    if not (0 < float(method.adalora_beta1) < 1 and 0 < float(method.adalora_beta2) < 1):
        raise ValueError("adalora_beta1 and adalora_beta2 must lie strictly between 0 and 1 (PEFT's RankAllocator)")
    if float(method.adalora_orth_reg) < 0:
        raise ValueError(f"adalora_orth_reg must be at least 0, not {method.adalora_orth_reg}")


def plan(model: PeltModel, total_steps: list[int]) -> None:
    model.adalora.plan(total_steps)


def regulariser(model: PeltModel) -> torch.Tensor:
    return model.adalora.regulariser(model.members)


def after_step(model: PeltModel, step: int) -> None:
    model.adalora.after_step(step, model.members.active_slots())


def state(model: PeltModel) -> dict:
    return model.adalora.checkpoint()


def restore(model: PeltModel, saved: dict) -> None:
    model.adalora.restore(saved)


def peft_refusal(method: DictConfig, arch) -> str | None:
    """Why an AdaLoRA run has no PEFT copy on this architecture (saving.peft_kind), or None."""
    fused = [t for t in method.adalora_targets if t in arch.projections and arch.projections[t][1] is not None]
    if fused:
        return (f"PEFT adapts {arch.name}'s fused {', '.join(fused)} as one matrix, with one budget and one "
                "regulariser for its blocks, which is not this run's AdaLoRA")
    return None
