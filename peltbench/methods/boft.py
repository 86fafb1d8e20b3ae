"""BOFT (Liu et al. 2024): a product of m butterfly factors rotates each adapted projection's input, and a trained
scale multiplies each output, as PEFT 0.21 with its CUDA block-diagonal kernel.

    y = b + s ⊙ (W Mᵀ x),   M = B_m ⋯ B_1,   B_i = P_i diag(C_i1, …, C_iN) P_iᵀ,   C = Cayley(½(R − Rᵀ))
R (m, N, b, b): N = in / b full b × b blocks per factor (PEFT's `boft_R`; only their skew part acts), exact Cayley
(I − Q)(I + Q)⁻¹ as PEFT's `cayley_batch`; P_i PEFT's block-butterfly permutations (P_1 = I); s (out, 1) PEFT's
`boft_s`, ones at init, and R zeros: M = I, s = 1, the model starts as the pretrained one. x ↦ x M as a row vector
(methods/rotation.py), s after the shared projection, around the frozen bias b.
Not taken: PEFT's `boft_dropout` (default 0; it draws from torch's global generator, which peltbench's per-run
dropout does not use). Without its CUDA extension PEFT silently uses m = 1 whatever is asked (docs/protocol.md).
"""

from __future__ import annotations

import functools
import sys

import torch
from omegaconf import DictConfig

from ..component import Component, Fit, POSITIVE_INT, PROJECTIONS, Peft, Setting
from . import rotation
from .base import PeltModel

COMPONENT = Component(
    stage="rotation", after=("hra",),
    settings={
        "boft_block_size": Setting(POSITIVE_INT, "BOFT block size b of each butterfly factor"),
        "boft_factors": Setting(POSITIVE_INT, "BOFT: the number m of butterfly factors (PEFT's "
                                              "boft_n_butterfly_factor)"),
        "boft_targets": Setting(PROJECTIONS, "the projections whose input BOFT rotates (and output it scales), a list "
                                             "from query, key, value"),
    },
    excludes={"bitfit": "boft_s scales W x around the frozen bias, which bitfit would train"},
    fits=(Fit("in_features % (boft_block_size * 2 ** (boft_factors - 1)) == 0 and (boft_factors == 1 or "
              "(boft_block_size % 2 == 0 and (in_features // boft_block_size) % 2 == 0))", targets="boft_targets",
              sides="in", why="boft_block_size={boft_block_size} with boft_factors={boft_factors} does not fit the "
              "adapted projections' input size {in_features} (b · 2^(m−1) must divide it; b and the block count even "
              "when m > 1)"),),
    label="BOFT", arxiv="2311.06243", peft=Peft("BOFT"),
)  # no gate: multiplicative, nothing additive for a gate to scale
PARAMETER = "boft_R"  # PEFT's names: `...query.boft_R`, `...query.boft_s`
PEFT_TENSOR = "boft_R"
OUTPUT_SCALE = "boft_s"  # a trained (out, 1) scale of the projection's output, around its bias


def peft_config(method: DictConfig) -> dict:
    """PEFT's BOFTConfig for this method (saving.export_rotation adds targets, head and task)."""
    return {"peft_type": "BOFT", "boft_block_size": int(method.boft_block_size), "boft_block_num": 0,
            "boft_n_butterfly_factor": int(method.boft_factors), "boft_dropout": 0.0}


def shape(method: DictConfig, features: int) -> tuple[int, int, int, int]:
    b, m = int(method.boft_block_size), int(method.boft_factors)
    why = COMPONENT.misfit(method, in_features=features)  # the rule check_config applies before torch to config.json
    if why:
        raise ValueError(why)
    return m, features // b, b, b


def settings(method: DictConfig) -> tuple:
    return ()


@functools.lru_cache(maxsize=None)
def permutation(n: int, blocks: int, half: int, factors: int) -> tuple[int, ...]:
    """PEFT's `block_butterfly_perm(n, blocks, half, factors − 1)`: row a of P_i is e_{perm[a]}."""
    if factors == 1:
        return tuple(range(n))
    size = n // blocks
    step = size / half
    pieces = torch.cat((torch.arange(0, step, 2), torch.arange(1, step, 2)))
    order = torch.empty(size, dtype=torch.long)
    for i, position in enumerate(pieces):
        order[int(i * half) : int(i * half + half)] = torch.arange(size)[int(position * half) : int(position * half + half)]
    indices = torch.arange(n)
    for start in range(0, n, size):
        indices[start : start + size] = indices[start : start + size][order]
    return tuple(indices.tolist())


def matrices(weight: torch.Tensor, method: DictConfig) -> torch.Tensor:
    """Member-stacked R (count, m, N, b, b) → M (count, 1, in, in), x ↦ x M."""
    count, m, blocks, b, _ = weight.shape
    q = 0.5 * (weight - weight.transpose(-1, -2))
    eye = torch.eye(b, dtype=weight.dtype, device=weight.device).expand_as(q)
    cayley = torch.linalg.solve(eye + q, eye - q, left=False)
    features = blocks * b
    diagonal = torch.einsum("cmnij,nk->cmnikj", cayley, torch.eye(blocks, dtype=weight.dtype, device=weight.device))
    diagonal = diagonal.reshape(count, m, features, features)
    product = None
    for i in range(m):
        perm = torch.tensor(permutation(features, blocks // 2 ** i, b // 2, m), device=weight.device)
        factor = diagonal[:, i].index_select(1, perm).index_select(2, perm)  # P D Pᵀ
        product = factor if product is None else factor @ product
    return product.unsqueeze(1)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    rotation.install(model, users, sys.modules[__name__], "boft")


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """R zeros, s ones (PEFT's init_weights=True): the slots already hold them, nothing is drawn."""


def check(method: DictConfig) -> None:
    rotation.check(method, "boft")
    if "bitfit" in method.components:
        raise ValueError("boft with bitfit: boft_s scales W x around the frozen bias, which bitfit would train")
