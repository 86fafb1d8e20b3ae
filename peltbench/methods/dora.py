"""DoRA (Liu et al. 2024, Eq. 5): LoRA plus a trained magnitude per output feature of each adapted projection.

    W' = m · (W + s·BA) / ‖W + s·BA‖,   y = W' x + b
‖·‖ is per output row, over the input dimension; m starts at ‖W‖ (B = 0), A and B as LoRA's. As PEFT does
(peft/tuners/lora/dora.py, after the paper's §4.3), the norm is a constant in backward, and W'x is computed from
the projection's own output: y = out + (m/‖·‖ − 1)·(out − b) + (m/‖·‖)·s·B(A x), out = W x + b.
The norm is the one product this costs beyond LoRA; it is computed without the full W + s·BA (see `row_norms`).

DoRA has no gate: its magnitude rescales the frozen path W x itself, and a gate per example would enter the norm
(one norm per example). A method listing DoRA with lora, vera or bitfit is refused: DoRA rescales the whole projection.

Started from PiSSA or OLoRA (`lora_init`, as PEFT allows with use_dora), DoRA is PEFT's on W_res = W − s·B₀A₀:
W_res + s·BA = W + s·[B, −B₀][A; A₀], so the norm and the delta take the rank-2r factors with the member's frozen
A₀, B₀, and the shared W x stays shared (lora.py).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from . import lora
from ..component import Component, Peft, rank_fit, setting_of
from .base import Members, PeltModel, Selection, mark

COMPONENT = Component(
    stage="projection", after=("lora",),  # in a group with both, DoRA's delta wraps LoRA's on a shared projection
    settings={key: setting_of("lora", key) for key in ("lora_rank", "lora_scale", "lora_targets", "lora_init")},
    excludes={"lora": "dora rescales the whole projection W, which lora changes too",
              "vera": "dora rescales the whole projection W, which vera changes too",
              "bitfit": "dora rescales the whole projection W, whose bias bitfit would train"},
    fits=(rank_fit("lora_rank", "lora_targets"),),
    label="DoRA", arxiv="2402.09353", peft=Peft("LORA", {"use_dora": True}),
)  # no gate: DoRA's magnitude rescales W x itself, and the norm would be per example (module docstring)
ALONE = ("lora", "vera", "bitfit")  # components that change the same projection: not in one method with DoRA


class DoRALinear(lora.LoRALinear):
    """LoRA's A and B with DoRA's magnitude m (members, out); `linear` is the frozen projection (weight, bias)."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None, linear: nn.Module) -> None:
        super().__init__(base, members, users, submodule, layer, in_features, out_features, block, linear)
        self.magnitude = nn.Parameter(torch.zeros(members.count, out_features))
        scales = [float(users[m].lora_scale) if m in users else 0.0 for m in range(members.count)]
        self.register_buffer("s", torch.tensor(scales), persistent=False)
        self.siblings: list[DoRALinear] = [self]  # the model's DoRA projections (install): norms computed together

    def scales(self, users: dict[int, DictConfig]) -> list[float]:
        return [1.0] * self.members.count  # s is applied inside the delta, to B(A x) only

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        scale_minus_one, coefficient = self.magnitudes(selection)  # (members, 1, out): m/‖·‖ − 1 and (m/‖·‖)·s
        frozen = self.members.gather(selection, out)  # W x + b: rows (of its block)
        if self.block is not None:
            frozen = frozen[..., self.block]
        bias = self.frozen()[1]
        if bias is not None:
            frozen = frozen - bias.to(frozen.dtype)
        low_rank = self.low_rank(rows, selection)
        grouped = (selection.count, -1, low_rank.shape[-1])
        delta = scale_minus_one * frozen.reshape(grouped) + coefficient * low_rank.reshape(grouped)
        return delta.to(low_rank.dtype).view(low_rank.shape)

    def factors(self, selection: Selection) -> tuple[torch.Tensor, torch.Tensor]:
        """The selected members' A, B; PiSSA / OLoRA: the factors of W + s·[B, −B₀][A; A₀] = W_res + s·BA."""
        a = self.members.slots_of(self.lora_a.weight, selection)
        b = self.members.slots_of(self.lora_b.weight, selection)
        if self.lora_a0 is not None:
            a0, b0 = self.initial(selection)
            a, b = torch.cat([a, a0], dim=1), torch.cat([b, -b0], dim=2)
        return a, b

    def magnitudes(self, selection: Selection) -> tuple[torch.Tensor, torch.Tensor]:
        """(m/‖W + s·BA‖ − 1, (m/‖W + s·BA‖)·s), each (selected members, 1, out). In a model's forward pass
        (Members.per_pass) made once for every DoRA projection of the model with the same members and shapes, in one
        batched norm, the first time one is needed."""
        cache = self.members.per_pass
        if cache is not None and (id(self), "dora") in cache:
            return cache[(id(self), "dora")]
        same = [self]
        if cache is not None:
            key = self._batch_key(selection)
            same = [sibling for sibling in self.siblings if sibling._batch_key(selection) == key]
        s = self.members.slots_of(self.s.to(self.magnitude.device), selection)
        factors = [sibling.factors(selection) for sibling in same]
        magnitude = [self.members.slots_of(sibling.magnitude, selection) for sibling in same]
        if len(same) == 1:
            weight, (a, b), magnitude = self.frozen()[0], factors[0], magnitude[0]
        else:
            weight = torch.stack([sibling.frozen()[0] for sibling in same])[:, None]  # (projections, 1, out, in)
            a, b = (torch.stack(tensors) for tensors in zip(*factors))
            magnitude = torch.stack(magnitude)
        scale = magnitude / row_norms(weight, a, b, s)  # (projections,) members, out
        result = (scale[..., None, :] - 1, (scale * s[:, None])[..., None, :])
        if len(same) == 1:
            if cache is not None:
                cache[(id(self), "dora")] = result
            return result
        for sibling, scales in zip(same, zip(*(part.unbind(0) for part in result))):
            cache[(id(sibling), "dora")] = scales
        return cache[(id(self), "dora")]

    def _batch_key(self, selection: Selection) -> tuple:
        """DoRA projections whose norms are computed together: the same members, shapes and PiSSA factors."""
        return self.users, tuple(self._linear[0].weight.shape), self.block is None, tuple(self.lora_a.weight.shape), \
            self.lora_a0 is not None

    def init_member(self, slot: int, method: DictConfig) -> None:
        """A, B as LoRA's (the same draws), then m = ‖W‖ per output row: ‖W + s·BA‖ at B = 0, as PEFT starts it
        (PiSSA / OLoRA: ‖W_res + s·B₀A₀‖ = ‖W‖ too)."""
        super().init_member(slot, method)
        with torch.no_grad():
            self.magnitude[slot] = torch.linalg.norm(self.frozen()[0].float(), dim=1)


@torch.no_grad()
def row_norms(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """‖W + s_m·B_m A_m‖ per output row for each member m (members, out), a constant in backward (§4.3), from
        ‖w_i + s·(BA)_i‖² = ‖w_i‖² + 2s·b_i·(W Aᵀ)_i + s²·b_i (A Aᵀ) b_iᵀ
    in fp32: one product W·[A_1; ...; A_M]ᵀ (out × in × M·r) for all members, and no out × in matrix per member.
    Several projections at once: W (projections, 1, out, in), A, B with a leading projection dimension."""
    weight, a, b = weight.float(), a.float(), b.float()
    s = s.float()[:, None]
    cross = (b * torch.matmul(weight, a.transpose(-1, -2))).sum(-1)          # (members, out)
    square = (torch.matmul(b, torch.matmul(a, a.transpose(-1, -2))) * b).sum(-1)  # (members, out)
    norms = weight.square().sum(-1) + 2 * s * cross + s.square() * square
    return norms.clamp(min=0).sqrt()


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    def make(base, on_target, target, layer, in_features, out_features, block):
        linear = lora.frozen_projection(model, model.layers[layer], target)
        return DoRALinear(base, model.members, on_target, f"dora_{target}", layer, in_features, out_features, block,
                          linear)

    made = lora.install_deltas(model, users, "lora_targets", make)
    for dora, on_target in made:
        mark(model, [*dora.lora_a.parameters(), *dora.lora_b.parameters(), dora.magnitude], on_target)
        dora.siblings = [delta for delta, _ in made]


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for dora in lora.delta_modules(model, method.lora_targets, DoRALinear):
        dora.init_member(slot, method)


def frozen_state(model: PeltModel, slot: int, method: DictConfig) -> dict[str, torch.Tensor]:
    """On a fused projection (ModernBERT's Wqkv) a PEFT copy is one DoRA on the whole Linear, whose rows outside our
    blocks keep PEFT's initial m = ‖W‖ (B is zero there): that vector, under `<Wqkv>.lora_magnitude_vector`; and a
    PiSSA / OLoRA member's A₀, B₀ (lora.initial_state)."""
    state = lora.initial_state(model, slot, method, DoRALinear)
    for name, module in model.named_modules():
        if isinstance(module, lora.FusedProjection) and any(
                type(delta) is DoRALinear and slot in delta.users for delta in module.modules()):
            norms = torch.linalg.norm(lora.frozen_linear(module.base).weight.float(), dim=1)
            state[model.stored_name(f"{name}.lora_magnitude_vector")] = norms
    return state


def check(method: DictConfig) -> None:
    lora.check(method)
    together = [name for name in ALONE if name in method.components]
    if together:
        raise ValueError(f"method {method.name}: dora rescales the whole projection W, so it cannot be combined with "
                         f"{', '.join(together)} (which change the same projection) in one method")
