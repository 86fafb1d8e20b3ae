"""FourierFT (Gao et al., ICML 2024, Eq. 2-4), as PEFT 0.21's FourierFTLayer: each adapted projection learns n
spectral coefficients c, placed at n fixed entries E of its out × in spectrum, and its weight change is the real part
of the inverse 2D DFT of that spectrum:

    F = 0 but F[E] = c,    ΔW = α · Re(IDFT2(F)),    y = W x + ΔW x

E is the first n of a random permutation of the out·in entries from a CPU generator seeded with
`fourierft_entry_seed` (PEFT's `random_loc_seed`), so every projection of one shape has the same entries (the paper's
entry matrix shared across layers); c is drawn N(0, 1) (the paper's §3.1, PEFT's default `init_weights=False`), so the
model does not start as the pretrained one; α = `fourierft_scaling`. Only c trains and is stored: n per projection.

ΔW is built in fp32 with autocast off, as PEFT builds it (torch.fft has no bf16 on a CPU), then multiplies the
projection's input as a Linear would (in bf16 under bf16 autocast, as PEFT's F.linear). In a fused group each member
has its own c, E and α (a member with a smaller n holds zeros past it, masked out of its spectrum; α multiplies its
ΔW before the product, in PEFT's order). On a fused projection (ModernBERT's Wqkv) each adapted row block has its own
H × H spectrum, which PEFT cannot express (it adapts the whole Wqkv): no PEFT copy there (saving.peft_kind).

No gate: a gated method listing fourierft is refused (its COMPONENT declares none).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from omegaconf import DictConfig
from torch import nn

from ..component import Component, Fit, POSITIVE_INT, PROJECTIONS, Peft, Setting, non_negative_int, positive_number, rule
from . import lora
from .base import Members, PeltModel, Selection, draw, mark

COMPONENT = Component(
    stage="projection", after=("vera",),
    settings={
        "fourierft_n_frequency": Setting(POSITIVE_INT, "FourierFT: the number n of trained spectral coefficients per "
                                                       "adapted projection"),
        "fourierft_scaling": Setting(rule(positive_number, "must be a positive number (α, which multiplies the weight "
                                                           "change)"),
                                     "FourierFT's alpha, which multiplies the weight change (PEFT's scaling)"),
        "fourierft_entry_seed": Setting(rule(non_negative_int, "must be a non-negative integer (the seed of the "
                                                               "spectral entries)"),
                                        "FourierFT: seed of the n spectral entries, shared by every projection "
                                        "(PEFT's random_loc_seed)"),
        "fourierft_targets": Setting(PROJECTIONS, "the projections FourierFT adapts, a list from query, key, value"),
    },
    fits=(Fit("fourierft_n_frequency <= out_features * in_features", targets="fourierft_targets",
              why="fourierft_n_frequency={fourierft_n_frequency} exceeds the {out_features} × {in_features} entries "
                  "of the adapted projections' spectrum"),),  # PEFT's rule
    label="FourierFT", arxiv="2405.03003", peft=Peft("FOURIERFT"),
)  # no gate: not a UniPELT submodule, PEFT has no gated FourierFT, and no gate was asked for


@lru_cache(maxsize=8)
def _permutation(seed: int, size: int) -> torch.Tensor:
    """PEFT's `torch.randperm(out · in, generator=Generator().manual_seed(random_loc_seed))`: every projection of one
    shape uses it (cached: a model has dozens of projections of the same shape)."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed), device="cpu")  # never under a model's
    # default device (count_method builds on "meta")


def entries(seed: int, n: int, out_features: int, in_features: int) -> torch.Tensor:
    """The n spectral entries as flat indices row · in + column (PEFT stacks them as [index // in, index % in])."""
    return _permutation(seed, out_features * in_features)[:n]


class FourierFTLinear(lora.ProjectionDelta):
    """FourierFT's delta on one projection: `fourierft_spectrum` (members, n) trained, `entries` and `valid`
    (members, n) buffers drawn again from each member's seed (not saved)."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None) -> None:
        super().__init__(base, members, users, block)
        n = max(int(method.fourierft_n_frequency) for method in users.values())
        for method in users.values():  # the rule check_config applies before torch to config.json
            why = COMPONENT.misfit(method, in_features=in_features, out_features=out_features, target=submodule.removeprefix("fourierft_"))
            if why:
                raise ValueError(why)
        self.fourierft_spectrum = nn.Parameter(torch.zeros(members.count, n))
        self.register_buffer("entries", torch.zeros(members.count, n, dtype=torch.long), persistent=False)
        self.register_buffer("valid", torch.zeros(members.count, n), persistent=False)
        self.in_features, self.out_features = in_features, out_features
        scales = [float(users[m].fourierft_scaling) if m in users else 0.0 for m in range(members.count)]
        self.register_buffer("scaling", torch.tensor(scales), persistent=False)
        self.set_coefficient(users, submodule, layer, in_features, [1.0] * members.count)  # α is in ΔW, as PEFT's

    def weight_change(self, selection: Selection) -> torch.Tensor:
        """ΔW = α · Re(IDFT2(F)) for the selected members (members, out, in), in fp32, in PEFT's order."""
        slots = self.members.slots_of
        spectrum = slots(self.fourierft_spectrum, selection)
        with torch.autocast(spectrum.device.type, enabled=False):
            coefficients = spectrum.float() * slots(self.valid, selection)  # a member's padding adds nothing
            dense = torch.zeros(selection.count, self.out_features * self.in_features, device=spectrum.device)
            dense = dense.scatter_add(1, slots(self.entries, selection), coefficients)
            change = torch.fft.ifft2(dense.view(-1, self.out_features, self.in_features)).real
            return change * slots(self.scaling, selection)[:, None, None]

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        weight = self.weight_change(selection)
        grouped = rows.reshape(selection.count, -1, rows.shape[-1])
        delta = torch.bmm(grouped, weight.transpose(1, 2).to(rows.dtype))
        return delta.view(*rows.shape[:-1], self.out_features)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """E from the entry seed (its own generator: the global stream is untouched), then c ~ N(0, 1) from the
        global stream, which build_pelt_model has seeded: PEFT's `torch.randn(n_frequency)`."""
        n = int(method.fourierft_n_frequency)
        with torch.no_grad():
            self.entries[slot] = 0  # a copy, wherever the model is (the permutation is made on the CPU)
            self.entries[slot, :n].copy_(entries(int(method.fourierft_entry_seed), n, self.out_features,
                                                 self.in_features))
            self.valid[slot] = 0
            self.valid[slot, :n] = 1
        draw(self.fourierft_spectrum[slot, :n], nn.init.normal_)
        self.coefficient.init_member(slot)


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    def make(base, on_target, target, layer, in_features, out_features, block):
        return FourierFTLinear(base, model.members, on_target, f"fourierft_{target}", layer, in_features,
                               out_features, block)

    for fourier, on_target in lora.install_deltas(model, users, "fourierft_targets", make):
        mark(model, [fourier.fourierft_spectrum], on_target)


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    """Layer by layer, q before v: the order PEFT creates (and draws) its FourierFT layers in."""
    for fourierft in lora.delta_modules(model, method.fourierft_targets, FourierFTLinear):
        fourierft.init_member(slot, method)


def peft_export(tensors: dict[str, torch.Tensor], method: DictConfig, arch) -> tuple[dict, dict[str, torch.Tensor]]:
    """PEFT's FourierFTConfig and state dict for a run's tensors (saving.export_own adds the head, task and base
    model): each spectrum under PEFT's name, n, α and the entry seed as PEFT's n_frequency, scaling, random_loc_seed
    (from which PEFT draws the same entries). Not on a fused projection (saving.peft_kind refuses it)."""
    targets = [t for t in lora.TARGETS if t in method.fourierft_targets]
    config = {"peft_type": "FOURIERFT", "n_frequency": int(method.fourierft_n_frequency),
              "scaling": float(method.fourierft_scaling), "random_loc_seed": int(method.fourierft_entry_seed),
              "init_weights": True, "fan_in_fan_out": False, "bias": "none",
              "target_modules": list(dict.fromkeys(arch.projections[t][0] for t in targets))}
    return config, {f"base_model.model.{name}": tensor for name, tensor in tensors.items()}


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.fourierft_targets) - set(lora.TARGETS))
    if unknown:
        raise ValueError(f"fourierft_targets: unknown projection(s) {unknown}; choose from {list(lora.TARGETS)}")


def peft_refusal(method: DictConfig, arch) -> str | None:
    """Why a FourierFT run has no PEFT copy on this architecture (saving.peft_kind), or None."""
    if lora.fused_targets(arch, method.fourierft_targets):
        return (f"PEFT's FourierFT adapts {arch.name}'s whole fused Wqkv with one spectrum of 3H × H; FourierFT "
                "on its q and v blocks (an H × H spectrum each) has no PEFT form (docs/saving.md)")
    return None
