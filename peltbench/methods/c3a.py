"""C3A (Chen et al., arXiv 2407.19342, §3.4 Eq. 3-4), as PEFT 0.21's C3ALayer: the weight change of each adapted
projection is block-circulant, one trained kernel of length b per b × b block:

    y = W x + (1 / in) · C_blk(w) x,    w: (out / b) × (in / b) × b,    C_blk(w)_ij = C(w_ij), circulant

(the 1 / in is PEFT's, not in the paper's equations), computed as PEFT computes it, by FFT over each block without
forming C_blk(w) (Eq. 1): per output block i, Σ_j FFT(IFFT(x_j) ⊙ FFT(w_ij)), real part (PEFT's
`BlockCircularConvolution`, forward and backward, here with a member dimension in front), all in fp32 with autocast
off (torch.fft has no bf16 on a CPU; PEFT runs it in fp32 too), cast to the projection's output dtype. w starts
xavier-uniform over the projection's in + out (the paper's App. F, PEFT's default `init_weights="xavier_uniform"`), so
the model does not start as the pretrained one. b = `c3a_block_size` must divide the projection's in and out; only w
trains and is stored: in · out / b per projection.

In a fused group every member has its own w; members of different block sizes get one C3A delta per block size on the
projection, each wrapping the previous (their kernels cannot share a shape), so each size is one batched FFT pass. On a
fused projection (ModernBERT's Wqkv) each adapted row block has its own kernel; as b divides H that is PEFT's C3A on
the whole Wqkv with the kernel's other rows zero, which is how it is exported (`peft_export`).

No gate: a gated method listing c3a is refused (its COMPONENT declares none).
"""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig
from torch import nn
from torch.fft import fft, ifft

from ..architectures import unwrapped
from ..component import Component, Fit, POSITIVE_INT, PROJECTIONS, Peft, Setting
from . import lora
from .base import Members, PeltModel, Selection, draw, mark

COMPONENT = Component(
    stage="projection", after=("fourierft",),
    settings={
        "c3a_block_size": Setting(POSITIVE_INT, "C3A block size b: one trained circular-convolution kernel of length b "
                                                "per b x b block"),
        "c3a_targets": Setting(PROJECTIONS, "the projections C3A adapts, a list from query, key, value"),
    },
    fits=(Fit("in_features % c3a_block_size == 0 and out_features % c3a_block_size == 0", targets="c3a_targets",
              why="c3a_block_size={c3a_block_size} must divide the adapted projections' input and output sizes "
                  "({in_features}, {out_features})"),),  # PEFT's rule
    label="C3A", arxiv="2407.19342", peft=Peft("C3A"),
)  # no gate: not a UniPELT submodule, PEFT has no gated C3A, and no gate was asked for


class MemberCircularConvolution(torch.autograd.Function):
    """PEFT's `BlockCircularConvolution` with a member dimension in front: x (members, rows, n, b), w (members, m, n, b)
    → (members, rows, m, b). Its backward is PEFT's, so gradients are computed as PEFT computes them."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return fft(torch.einsum("prnb,pmnb->prmb", ifft(x), fft(w))).real

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        grad_fft = fft(grad)
        x_grad = fft(torch.einsum("prmb,pmnb->prnb", grad_fft, ifft(w))).real
        w_grad = fft(torch.einsum("prmb,prnb->pmnb", grad_fft, ifft(x))).real
        return x_grad, w_grad


class C3ALinear(lora.ProjectionDelta):
    """C3A's delta on one projection for the members of one block size: `c3a_kernel` (members, out/b, in/b, b)."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None) -> None:
        super().__init__(base, members, users, block)
        [size] = {int(method.c3a_block_size) for method in users.values()}  # install: one delta per block size
        for method in users.values():  # the rule check_config applies before torch to config.json
            why = COMPONENT.misfit(method, in_features=in_features, out_features=out_features, target=submodule.removeprefix("c3a_"))
            if why:
                raise ValueError(why)
        self.block_size, self.in_features, self.out_features = size, in_features, out_features
        self.c3a_kernel = nn.Parameter(torch.zeros(members.count, out_features // size, in_features // size, size))
        self.set_coefficient(users, submodule, layer, in_features, [1.0] * members.count)  # 1/in is in the delta

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        kernel = self.members.slots_of(self.c3a_kernel, selection)
        with torch.autocast(rows.device.type, enabled=False):
            x = rows.float().reshape(selection.count, -1, self.in_features // self.block_size, self.block_size)
            y = MemberCircularConvolution.apply(x, kernel.float()) / self.in_features
        return y.reshape(*rows.shape[:-1], self.out_features).to(out.dtype)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """PEFT's xavier-uniform: U(−a, a), a = √3 · √(2 / (in + out)), on a kernel of the member's shape."""
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (self.in_features + self.out_features))
        draw(self.c3a_kernel[slot], lambda tensor: nn.init.uniform_(tensor, -bound, bound))
        self.coefficient.init_member(slot)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    def make(base, on_target, target, layer, in_features, out_features, block):
        return C3ALinear(base, model.members, on_target, f"c3a_{target}", layer, in_features, out_features, block)

    for size in sorted({int(method.c3a_block_size) for method in users.values()}):
        sized = {m: method for m, method in users.items() if int(method.c3a_block_size) == size}
        for c3a, on_target in lora.install_deltas(model, sized, "c3a_targets", make):
            mark(model, [c3a.c3a_kernel], on_target)


def member_delta(model: PeltModel, layer: nn.Module, target: str, slot: int) -> C3ALinear:
    """The C3A delta on `target` of a layer that holds member `slot` (one per block size may wrap the projection)."""
    name, block = model.arch.projections[target]
    module = unwrapped(getattr(model.attention(layer), name))
    module = module if block is None else getattr(module, target)
    while not (type(module) is C3ALinear and slot in module.users):
        module = module.base
    return module


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Layer by layer, q before v: the order PEFT creates (and draws) its C3A layers in."""
    for layer in model.layers:
        for target in lora.TARGETS:
            if target in method.c3a_targets:
                member_delta(model, layer, target, slot).init_member(slot, method)


def peft_export(tensors: dict[str, torch.Tensor], method: DictConfig, arch) -> tuple[dict, dict[str, torch.Tensor]]:
    """PEFT's C3AConfig and state dict for a run's tensors (saving.export_own adds the head, task and base model). On a
    fused projection (ModernBERT's Wqkv) one C3A on the whole Linear: b divides H, so its block-circular weight change
    has our q and v kernels in their rows, zero kernels in the rows the run leaves alone."""
    targets = [t for t in lora.TARGETS if t in method.c3a_targets]
    config = {"peft_type": "C3A", "block_size": int(method.c3a_block_size), "init_weights": True, "bias": "none",
              "target_modules": list(dict.fromkeys(arch.projections[t][0] for t in targets))}
    renamed, blocks = {}, {}
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        parent, _, target = module.rpartition(".")
        if kind == "c3a_kernel" and arch.projections.get(target, (None, None))[1] is not None:
            blocks.setdefault(parent, {})[arch.projections[target][1]] = tensor  # a block of a fused projection
            continue
        renamed[f"base_model.model.{name}"] = tensor
    for module, parts in blocks.items():
        zero = torch.zeros_like(next(iter(parts.values())))
        renamed[f"base_model.model.{module}.c3a_kernel"] = torch.cat(
            [parts.get(block, zero) for block in range(len(arch.projections))])
    return config, renamed


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.c3a_targets) - set(lora.TARGETS))
    if unknown:
        raise ValueError(f"c3a_targets: unknown projection(s) {unknown}; choose from {list(lora.TARGETS)}")
