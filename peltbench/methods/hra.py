"""HRA (Yuan et al. 2024): a product of r Householder reflections on each adapted projection's input, as PEFT 0.21.

    y = W R x,   R = H_1 H_2 ⋯ H_r,   H_i = I − 2 û_i û_iᵀ,   û_i = u_i / ‖u_i‖
U = [u_1 … u_r] (in × r, PEFT's `hra_u`) trains. PEFT multiplies the weight on its input side (W ↦ W R), which is
the input rotation x ↦ R x of methods/rotation.py with one block of the whole input (x ↦ x Rᵀ as a row vector).
Init (PEFT's `init_weights=True`, r even): kaiming-uniform (a = √5) columns drawn for r/2 reflections, each repeated
twice (H_i H_i = I), so R = I at the start; r odd: all r columns drawn (PEFT warns that R ≠ I then).
`hra_apply_gs: true` is PEFT's `apply_GS`: the columns orthonormalised by Gram-Schmidt, R = I − 2 Û Ûᵀ.
A reflection multiplies the frozen path: no gate (GATE = None).
"""

from __future__ import annotations

import math
import sys

import torch
from omegaconf import DictConfig
from torch import nn

from . import rotation
from .base import PeltModel

GATE = None  # multiplicative: nothing additive for a gate to scale
PARAMETER = "hra_u"  # PEFT's parameter name: `...query.hra_u`
PEFT_TENSOR = "hra_u"  # its name in PEFT's saved adapter (ours: `...query.hra_u.weight`)


def peft_config(method: DictConfig) -> dict:
    """PEFT's HRAConfig for this method (saving.export_rotation adds targets, head and task)."""
    return {"peft_type": "HRA", "r": int(method.hra_rank), "apply_GS": bool(method.hra_apply_gs)}


def shape(method: DictConfig, features: int) -> tuple[int, int]:
    return features, int(method.hra_rank)


def settings(method: DictConfig) -> tuple:
    return (bool(method.hra_apply_gs),)


def reflections(u: torch.Tensor, apply_gs: bool) -> torch.Tensor:
    """(count, in, r) → R (count, in, in) as PEFT's `get_delta_weight`."""
    eye = torch.eye(u.shape[1], dtype=u.dtype, device=u.device).expand(u.shape[0], -1, -1)
    if apply_gs:
        columns = [u[..., :1] / u[..., :1].norm(dim=1, keepdim=True)]
        for i in range(1, u.shape[-1]):
            column = u[..., i : i + 1]
            for done in columns:
                column = column - (done.transpose(1, 2) @ column) * done
            columns.append(column / column.norm(dim=1, keepdim=True))
        unit = torch.cat(columns, dim=-1)
        return eye - 2 * unit @ unit.transpose(1, 2)
    unit = u / u.norm(dim=1, keepdim=True)
    weight = eye
    for column, row in zip(unit.split(1, dim=2), unit.transpose(1, 2).split(1, dim=1)):  # û_i, û_iᵀ
        weight = weight - torch.bmm(2 * torch.bmm(weight, column), row)
    return weight


def matrices(weight: torch.Tensor, method: DictConfig) -> torch.Tensor:
    """Member-stacked U (count, in, r) → one block per member, Rᵀ (x ↦ x Rᵀ on the row vector): (count, 1, in, in)."""
    return reflections(weight, bool(method.hra_apply_gs)).transpose(1, 2).unsqueeze(1)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    rotation.install(model, users, sys.modules[__name__], "hra")


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """PEFT's symmetric init, module after module in the order a separate run builds them."""
    r = int(method.hra_rank)
    for module in rotation.member_rotations(model, PARAMETER, slot):
        features = module.weight.shape[1]
        if r % 2:
            drawn = nn.init.kaiming_uniform_(torch.empty(features, r), a=math.sqrt(5))
        else:
            half = nn.init.kaiming_uniform_(torch.zeros(features, r // 2), a=math.sqrt(5))
            drawn = torch.repeat_interleave(half, 2, dim=1)
        with torch.no_grad():
            module.weight[slot, :, :r].copy_(drawn)


def check(method: DictConfig) -> None:
    rotation.check(method, "hra")
