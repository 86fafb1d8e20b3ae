"""OFT (Qiu et al. 2023): a block-diagonal orthogonal rotation of each adapted projection's input, as PEFT 0.21.

    y = W (R x),  R = diag(R_1, ..., R_r),  R_i = Cayley(Q_i) with Q_i = S_i − S_iᵀ skew-symmetric (b × b)
S_i holds the b(b−1)/2 trained entries above the diagonal (PEFT's `oft_R.weight`, (r, b(b−1)/2), r = in / b), zeros
at init (R = I). Cayley: PEFT's default `use_cayley_neumann=True` truncates (I + Q)(I − Q)⁻¹ to
I + 2Q + 2Q² + … + 2Q^(n−2) + Q^(n−1) with n = `oft_neumann_terms` (5); `oft_neumann_terms: 0` is PEFT's exact
transform, R = (I − Q)(I + Q)⁻¹. Not taken: COFT (`coft`) and `block_share` (both off by default in PEFT) and
`module_dropout` (PEFT 0.21's Linear builds the dropout layer but its forward never applies it). A rotation
multiplies the frozen path: it has no gate (its COMPONENT declares none) and is refused in a gated mixture.
"""

from __future__ import annotations

import sys

import torch
from omegaconf import DictConfig

from ..component import Component, Fit, POSITIVE_INT, PROJECTIONS, Peft, Setting, non_negative_int, rule
from . import rotation
from .base import PeltModel

COMPONENT = Component(
    stage="rotation",  # a rotation hooks the input of whatever computes the projection (the deltas are in place)
    settings={
        "oft_block_size": Setting(POSITIVE_INT, "OFT block size b (r = in_features / b rotation blocks)"),
        "oft_neumann_terms": Setting(rule(non_negative_int, "must be 0 (the exact Cayley transform) or a number of "
                                                            "Neumann terms"),
                                     "OFT's Cayley transform: Neumann terms (PEFT's default 5), or 0 for the exact "
                                     "inverse"),
        "oft_targets": Setting(PROJECTIONS, "the projections whose input OFT rotates, a list from query, key, value"),
    },
    fits=(Fit("in_features % oft_block_size == 0", targets="oft_targets", sides="in",
              why="oft_block_size={oft_block_size} must divide the adapted projections' input size {in_features}"),),
    label="OFT", arxiv="2306.07280", peft=Peft("OFT"),
)  # no gate: multiplicative, nothing additive for a gate to scale
PARAMETER = "oft_R"  # PEFT's module name: `...query.oft_R.weight`
PEFT_TENSOR = "oft_R.weight"  # its name in PEFT's saved adapter


def peft_config(method: DictConfig) -> dict:
    """PEFT's OFTConfig for this method (saving.export_rotation adds targets, head and task)."""
    terms = int(method.oft_neumann_terms)
    return {"peft_type": "OFT", "r": 0, "oft_block_size": int(method.oft_block_size), "module_dropout": 0.0,
            "coft": False, "eps": 6e-5, "block_share": False, "use_cayley_neumann": terms > 0,
            "num_cayley_neumann_terms": terms if terms > 0 else 5}


def shape(method: DictConfig, features: int) -> tuple[int, int]:
    """(blocks, entries per block) of one member's parameter on a projection with `features` inputs."""
    b = int(method.oft_block_size)
    why = COMPONENT.misfit(method, in_features=features)  # the rule check_config applies before torch to config.json
    if why:
        raise ValueError(why)
    return features // b, b * (b - 1) // 2


def settings(method: DictConfig) -> tuple:
    return (int(method.oft_neumann_terms),)


def skew(weight: torch.Tensor, size: int) -> torch.Tensor:
    """(..., b(b−1)/2) upper-triangle entries → (..., b, b) skew-symmetric matrices (PEFT's row-major triu order)."""
    rows, cols = torch.triu_indices(size, size, 1, device=weight.device)
    matrix = weight.new_zeros(*weight.shape[:-1], size, size)
    matrix[..., rows, cols] = weight
    return matrix - matrix.transpose(-2, -1)


def cayley(q: torch.Tensor, terms: int) -> torch.Tensor:
    """PEFT's `_cayley_batch` on (..., b, b): the Neumann truncation with `terms` terms, or exact with 0."""
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device).expand_as(q)
    if terms == 0:
        return torch.linalg.solve(eye + q, eye - q, left=False)
    r = eye.clone()
    if terms > 1:
        r = r + 2 * q
        if terms > 2:
            power = q @ q
            r = r + 2 * power
            for _ in range(3, terms - 1):
                power = power @ q
                r = r + 2 * power
            r = r + power @ q
    return r


def matrices(weight: torch.Tensor, method: DictConfig) -> torch.Tensor:
    """Member-stacked (count, r, b(b−1)/2) → the members' rotation blocks (count, r, b, b)."""
    return cayley(skew(weight, int(method.oft_block_size)), int(method.oft_neumann_terms))


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    rotation.install(model, users, sys.modules[__name__], "oft")


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Zeros (PEFT's init_weights=True: R = I at the start), which the slot already holds: nothing is drawn."""


def check(method: DictConfig) -> None:
    rotation.check(method, "oft")
    if int(method.oft_neumann_terms) < 0:
        raise ValueError("oft_neumann_terms must be 0 (the exact Cayley transform) or a number of Neumann terms")
