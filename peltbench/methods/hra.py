"""HRA (Yuan et al. 2024): a product of r Householder reflections on each adapted projection's input, as PEFT 0.21.

    y = W R x,   R = H_1 H_2 ⋯ H_r,   H_i = I − 2 û_i û_iᵀ,   û_i = u_i / ‖u_i‖
U = [u_1 … u_r] (in × r, PEFT's `hra_u`) trains. PEFT multiplies the weight on its input side (W ↦ W R), which is
the input rotation x ↦ R x of methods/rotation.py with one block of the whole input (x ↦ x Rᵀ as a row vector).
Init (PEFT's `init_weights=True`, r even): kaiming-uniform (a = √5) columns drawn for r/2 reflections, each repeated
twice (H_i H_i = I), so R = I at the start; r odd: all r columns drawn (PEFT warns that R ≠ I then).
`hra_apply_gs: true` is PEFT's `apply_GS`: the columns orthonormalised by Gram-Schmidt, R = I − 2 Û Ûᵀ.
A reflection multiplies the frozen path: no gate (its COMPONENT declares none).
"""

from __future__ import annotations

import math
import sys

import torch
from omegaconf import DictConfig
from torch import nn

from . import rotation
from ..component import BOOL, Component, Fit, POSITIVE_INT, PROJECTIONS, Peft, Setting
from .base import PeltModel

COMPONENT = Component(
    stage="rotation", after=("oft",),
    settings={
        "hra_rank": Setting(POSITIVE_INT, "HRA: the number r of Householder reflections"),
        "hra_apply_gs": Setting(BOOL, "HRA: orthonormalise the reflections' vectors by Gram-Schmidt (PEFT's apply_GS)"),
        "hra_targets": Setting(PROJECTIONS, "the projections whose input HRA reflects, a list from query, key, value"),
    },
    fits=(Fit("hra_rank <= in_features", targets="hra_targets", sides="in",  # more are redundant; Gram-Schmidt fails
              why="hra_rank={hra_rank} is above the adapted {target}'s input size {in_features}: its reflections are "
                  "vectors of that size, and more than {in_features} add nothing; set method.hra_rank={in_features} "
                  "or lower"),),
    label="HRA", arxiv="2405.17484", peft=Peft("HRA"),
)  # no gate: multiplicative, nothing additive for a gate to scale
PARAMETER = "hra_u"  # PEFT's parameter name: `...query.hra_u`
PEFT_TENSOR = "hra_u"  # its name in PEFT's saved adapter (ours: `...query.hra_u.weight`)


def peft_config(method: DictConfig) -> dict:
    """PEFT's HRAConfig for this method (saving.export_rotation adds targets, head and task)."""
    return {"peft_type": "HRA", "r": int(method.hra_rank), "apply_GS": bool(method.hra_apply_gs)}


def shape(method: DictConfig, features: int) -> tuple[int, int]:
    return features, int(method.hra_rank)


def settings(method: DictConfig) -> tuple:
    return (bool(method.hra_apply_gs),)


def factors(u: torch.Tensor, apply_gs: bool) -> rotation.LowRank:
    """(count, in, r) → R = H_1 H_2 ⋯ H_r (PEFT's `get_delta_weight`) as I − Û T Ûᵀ: the compact WY form of a product
    of Householder reflections H_i = I − 2 û_i û_iᵀ, with T⁻¹ = ½ I + the strictly upper part of ÛᵀÛ (Schreiber and
    Van Loan 1989; T upper triangular, r × r). apply_GS: Û orthonormalised by Gram-Schmidt, R = I − 2 Û Ûᵀ."""
    count, _, r = u.shape
    eye = torch.eye(r, dtype=u.dtype, device=u.device).expand(count, -1, -1)
    if apply_gs:
        columns = [u[..., :1] / u[..., :1].norm(dim=1, keepdim=True)]
        for i in range(1, r):
            column = u[..., i : i + 1]
            for done in columns:
                column = column - (done.transpose(1, 2) @ column) * done
            columns.append(column / column.norm(dim=1, keepdim=True))
        return rotation.LowRank(torch.cat(columns, dim=-1), 2 * eye)
    unit = u / u.norm(dim=1, keepdim=True)
    inverse = torch.triu(torch.bmm(unit.transpose(1, 2), unit), diagonal=1) + 0.5 * eye
    return rotation.LowRank(unit, torch.linalg.solve_triangular(inverse, eye, upper=True))


def reflections(u: torch.Tensor, apply_gs: bool) -> torch.Tensor:
    """(count, in, r) → R (count, in, in) as PEFT's `get_delta_weight` (from the compact form: what the model
    applies)."""
    low = factors(u, apply_gs)
    eye = torch.eye(u.shape[1], dtype=u.dtype, device=u.device)
    return eye - low.u @ low.t @ low.u.transpose(1, 2)


def matrices(weight: torch.Tensor, method: DictConfig) -> rotation.LowRank:
    """Member-stacked U (count, in, r) → each member's R in compact form (rotation.LowRank), x ↦ x Rᵀ on the row
    vector: never an in × in matrix."""
    return factors(weight, bool(method.hra_apply_gs))


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
