"""LoRA (Hu et al. 2021; UniPELT Eq. 3), on the query and value projections by default.

    y = W x + s · B(A x)
A: H → r, kaiming-uniform (a = √5); B: r → H, zeros; no dropout. Where the projections are (a row block of
ModernBERT's fused Wqkv) is the architecture map's business (architectures.py). Ungated, s is the constant
`lora_scale` (the paper's α = 2). Gated (UniPELT), each adapted projection gets its own gate from its
input, and the gate replaces s (official code; docs/protocol.md). LoRA-FA (`lora_freeze_a`): A stays at its draw and
only B trains.

`lora_init` (PEFT's `init_lora_weights`): `kaiming` (the above; PEFT's True), or `pissa` / `olora`, which start A and B
at the principal part of W (its top-r singular vectors; its QR factors) and, as PEFT, take that part out of W:
W_res = W − s·B₀A₀. A fused group shares one W, so each such member keeps its own frozen B₀, A₀ instead and computes
    y = W x + s · (B(A x) − B₀(A₀ x))  =  W_res x + s · B(A x)
(equal to PEFT's to float rounding: tests/test_lora_init.py). Ungated only: a gate replaces s, and W_res was cut with s.

`ProjectionDelta` and `install_deltas` are where any delta on a projection goes (LoRA's here, DoRA's, VeRA's), on
every architecture and for every member of a group; a method on the projections subclasses it and says its delta.
A delta may also sit on a layer's other Linears (`DENSE`: the attention output and the FFN's two, RoAd's), found by
`site` from the architecture map as AdaLoRA finds them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from ..architectures import unwrapped
from ..component import BOOL, Check, Component, POSITIVE_INT, POSITIVE_NUMBER, PROJECTIONS, Peft, Setting, choice, rank_fit
from .base import Coefficient, FfnOutput, MemberLinear, Members, PeltModel, Selection, draw, mark, scale_grouped

COMPONENT = Component(
    stage="projection",
    settings={
        "lora_rank": Setting(POSITIVE_INT, "LoRA rank r"),
        "lora_scale": Setting(POSITIVE_NUMBER, "LoRA scale (App. B's alpha); unused while gated; Figure 3 sweeps it"),
        "lora_targets": Setting(PROJECTIONS, "the projections LoRA adapts, a list from query, key, value"),
        "lora_freeze_a": Setting(BOOL, "LoRA-FA: LoRA's A stays at its random init, only B trains (default false)",
                                 default=False),
        "lora_init": Setting(choice("kaiming", "pissa", "olora", must="must be kaiming (A kaiming-uniform, B zero), "
                                    "pissa or olora (PEFT's init_lora_weights)"),
                             "LoRA's (DoRA's) init: kaiming (default), pissa or olora (A, B from W's principal part, "
                             "taken out of W)", default="kaiming"),
    },
    gate="the delta s·BAx of each adapted projection: one gate per projection and layer, which replaces s",
    checks=(Check("lora_init == 'kaiming' or not gated",
                  "method.lora_init={lora_init}: takes s·B₀A₀ out of W, and a gate replaces s: PiSSA and OLoRA run "
                  "ungated (method.gated=false)"),),
    fits=(rank_fit("lora_rank", "lora_targets"),),
    label="LoRA", arxiv="2106.09685", peft=Peft("LORA"),
)

TARGETS = ("query", "key", "value")  # the attention projections LoRA may adapt (where each sits: architectures.py)
DENSE = ("attention_output", "intermediate", "output")  # a layer's other Linears (architectures.dense)
LINEARS = (*TARGETS, *DENSE)  # every Linear of a layer, in the order deltas are installed on them
INITS = ("kaiming", "pissa", "olora")  # lora_init: PEFT's init_lora_weights True, "pissa", "olora"


def residual(method: DictConfig) -> bool:
    """Whether a method's LoRA starts from W's principal part and so computes on W_res (PiSSA, OLoRA)."""
    return method.get("lora_init", "kaiming") != "kaiming"


def kaiming(tensor: torch.Tensor) -> torch.Tensor:
    return nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))


class ProjectionDelta(nn.Module):
    """One component's delta on one projection W, added on the rows of the members that use it there:
        y = W x + c · delta(x)
    with c each member's Coefficient (its gate when gated, else a constant). A subclass says what `delta` is
    (LoRA's B(A x), VeRA's, DoRA's); this class says where it goes, once for every such method.

    `base`: the module it wraps — the projection (a Linear, or another component's delta on it in a fused group), or,
    inside a fused projection (ModernBERT's Wqkv, `FusedProjection`), the previous delta on its row `block` or None:
    the delta then adds to its own rows of the fused output, so a delta on q and v of Wqkv is exactly the delta on
    separate q and v projections."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig],
                 block: slice | None) -> None:
        super().__init__()
        self.base = base
        self.block = block
        self.members = members
        self.users = tuple(sorted(users))

    def set_coefficient(self, users: dict[int, DictConfig], submodule: str, layer: int, in_features: int,
                        scales: list[float]) -> None:
        """Called by a subclass after its own weights (the order the parameters have always been registered in)."""
        gated = [bool(users[m].get("gated", False)) if m in users else False for m in range(self.members.count)]
        self.coefficient = Coefficient(self.members, in_features, submodule, layer, gated, scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.members.funnel(x)  # the projection's terms of x's gradient summed as alone (Members.funnel)
        return self.add(x, self.base(x))

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out (the projection's output for x) plus this delta, on the rows of the members that have it."""
        if self.block is not None and self.base is not None:  # another component's delta on the same block
            out = self.base.add(x, out)
        selection = self.members.select(self.users, x.device)
        if not selection.count:
            return out
        rows = self.members.gather(selection, x)  # only the members with this delta here
        coefficient = self.coefficient(rows, selection)
        if coefficient is None:
            delta = self.delta(rows, selection, out)
        else:  # scaled member by member while grouped (members, rows · tokens, out)
            delta = scale_grouped(self.grouped_delta(rows, selection, out), coefficient).view(*rows.shape[:-1], -1)
        if self.block is not None:  # its rows of a fused projection's output, zeros elsewhere
            delta = F.pad(delta, (self.block.start, out.shape[-1] - self.block.stop))
        return self.members.add_rows(selection, out, delta)

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        """The selected members' delta for their rows of x (`out`: the whole projection output, all rows)."""
        raise NotImplementedError

    def grouped_delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        """The delta as (selected members, rows · tokens, out)."""
        delta = self.delta(rows, selection, out)
        return delta.view(selection.count, -1, delta.shape[-1])


class LoRALinear(ProjectionDelta):
    """LoRA's delta B(A x). Members with a smaller rank than the group's largest hold zeros in the rest of A and B,
    and members without LoRA on this projection hold zeros everywhere. Where some member starts from PiSSA or OLoRA,
    `lora_a0` and `lora_b0` hold each such member's frozen B₀, A₀ (zeros for the others; module docstring)."""

    def __init__(self, base: nn.Module | None, members: Members, users: dict[int, DictConfig], submodule: str,
                 layer: int, in_features: int, out_features: int, block: slice | None = None,
                 linear: nn.Module | None = None) -> None:
        super().__init__(base, members, users, block)
        rank = max(method.lora_rank for method in users.values())
        self.lora_a = MemberLinear(members, in_features, rank, bias=False)
        self.lora_b = MemberLinear(members, rank, out_features, bias=False)
        self.set_coefficient(users, submodule, layer, in_features, self.scales(users))
        self._linear = [linear]  # a reference, not a submodule: the projection belongs to the backbone
        corrected = any(residual(method) for method in users.values())  # on the device of the backbone's weight
        device = linear.weight.device if corrected else None
        self.register_buffer("lora_a0", torch.zeros(members.count, rank, in_features, device=device) if corrected
                             else None, persistent=False)
        self.register_buffer("lora_b0", torch.zeros(members.count, out_features, rank, device=device) if corrected
                             else None, persistent=False)

    def scales(self, users: dict[int, DictConfig]) -> list[float]:
        """The constant that multiplies each member's delta when it is not gated: s."""
        return [float(users[m].lora_scale) if m in users else 1.0 for m in range(self.members.count)]

    def frozen(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """W and b of this delta's rows of the frozen projection."""
        linear = self._linear[0]
        bias = getattr(linear, "pretrained", linear.bias)  # BitFit's MemberBias keeps the pretrained bias there
        if self.block is None:
            return linear.weight, bias
        return linear.weight[self.block], None if bias is None else bias[self.block]

    def delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        return self.low_rank(rows, selection)

    def grouped_delta(self, rows: torch.Tensor, selection: Selection, out: torch.Tensor) -> torch.Tensor:
        return self.grouped_low_rank(rows, selection)

    def low_rank(self, rows: torch.Tensor, selection: Selection) -> torch.Tensor:
        """B(A x) for the selected members' rows, minus B₀(A₀ x) where a member started from PiSSA / OLoRA."""
        return self.grouped_low_rank(rows, selection).view(*rows.shape[:-1], -1)

    def grouped_low_rank(self, rows: torch.Tensor, selection: Selection) -> torch.Tensor:
        """`low_rank` as (selected members, rows · tokens, out)."""
        grouped = rows.reshape(selection.count, -1, rows.shape[-1])
        product = self.lora_b.grouped(self.lora_a.grouped(grouped, selection), selection)
        if self.lora_a0 is None:
            return product
        a0, b0 = self.initial(selection)
        return product - torch.bmm(torch.bmm(grouped, a0.transpose(1, 2)), b0.transpose(1, 2))

    def initial(self, selection: Selection) -> tuple[torch.Tensor, torch.Tensor]:
        """The selected members' frozen A₀, B₀ (zeros for a member with the kaiming init)."""
        return self.members.slots_of(self.lora_a0, selection), self.members.slots_of(self.lora_b0, selection)

    def init_member(self, slot: int, method: DictConfig) -> None:
        """A kaiming-uniform, B zeros (already), then the gate: the order a separate run draws them in. PiSSA / OLoRA:
        A = A₀ and B = B₀ from W, nothing drawn."""
        if residual(method):
            self.init_principal(slot, method)
        else:
            draw(self.lora_a.weight[slot, : method.lora_rank], kaiming)
        self.coefficient.init_member(slot)

    @torch.no_grad()
    def init_principal(self, slot: int, method: DictConfig) -> None:
        """PEFT's `pissa_init` / `olora_init` on this delta's rows of W (in fp32), kept as the member's A₀, B₀ too."""
        weight = self.frozen()[0]
        if weight.device.type == "meta":  # counting on the meta device (methods.count_method): no values to factor
            return
        a, b = principal(weight.float(), method)
        rank = method.lora_rank
        for target, value in ((self.lora_a.weight[slot, :rank], a), (self.lora_b.weight[slot, :, :rank], b),
                              (self.lora_a0[slot, :rank], a), (self.lora_b0[slot, :, :rank], b)):
            target.copy_(value)


def principal(weight: torch.Tensor, method: DictConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(A₀, B₀) of PiSSA or OLoRA for an out × in W in fp32, as PEFT 0.21's LoraLayer computes them:
    PiSSA: W = V S Uᵀ, A₀ = √(S_r/s) U_rᵀ, B₀ = V_r √(S_r/s); OLoRA: W = Q R, A₀ = R_r (first r rows), B₀ = Q_r."""
    rank = int(method.lora_rank)
    if method.lora_init == "pissa":
        v, s, uh = torch.linalg.svd(weight, full_matrices=False)
        root = torch.diag(torch.sqrt(s[:rank] / float(method.lora_scale)))
        return root @ uh[:rank], v[:, :rank] @ root
    q, r = torch.linalg.qr(weight)
    return r[:rank].contiguous(), q[:, :rank].contiguous()


class FusedProjection(nn.Module):
    """A fused projection (ModernBERT's Wqkv = [W_q; W_k; W_v]) with deltas on some of its blocks: the fused output is
    computed once, and each block's delta (registered under its target's name: query, value ...) adds to its own
    rows."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.targets: list[str] = []

    def add_target(self, target: str, delta: ProjectionDelta) -> None:
        """Put `delta` on a block (it wraps the delta already there, its `base`)."""
        self.add_module(target, delta)
        if target not in self.targets:
            self.targets.append(target)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = getattr(self, self.targets[0]).members.funnel(x)  # as ProjectionDelta.forward
        out = self.base(x)
        for target in self.targets:
            out = getattr(self, target).add(x, out)
        return out


def frozen_linear(module: nn.Module) -> nn.Module:
    """The pretrained projection under the deltas wrapping it (a Linear, or BitFit's MemberBias with its weight)."""
    while not hasattr(module, "weight"):
        module = module.inner if hasattr(module, "inner") else module.base  # (IA)³'s scale keeps it as `inner`
    return module


def delta_module(model: PeltModel, layer: nn.Module, target: str, kind: type) -> ProjectionDelta:
    """The `kind` delta (LoRALinear ...) on `target` (a name of LINEARS) of a layer, among the deltas there."""
    parent, name, block = site(model, layer, target)
    module = unwrapped(getattr(parent, name))  # under a later wrapper ((IA)³'s scale)
    module = module if block is None else getattr(module, target)
    while type(module) is not kind:
        module = module.inner if "inner" in module._modules else module.base
    return module


def delta_modules(model: PeltModel, targets, kind: type):
    """The `kind` deltas on `targets` (names of LINEARS) of every layer, layer by layer in LINEARS' order (the order
    install_deltas makes them in)."""
    for layer in model.layers:
        for target in LINEARS:
            if target in targets:
                yield delta_module(model, layer, target, kind)


def site(model: PeltModel, layer: nn.Module, target: str) -> tuple[nn.Module, str, int | None]:
    """(parent module, attribute name, row block or None) of the Linear a target (a name of LINEARS) names in a
    layer: q, k, v in the attention module (architectures.projections), the others by their path from the layer
    (architectures.dense), looking through peltbench's wrappers on the way (FfnOutput's `base`, others' `inner`)."""
    if target in TARGETS:
        name, block = model.arch.projections[target]
        return model.attention(layer), name, block
    *path, name = model.arch.dense[target].split(".")
    parent = layer
    for part in path:
        parent = _child(parent, part)
    while name not in parent._modules:  # a wrapper of the parent's (FfnOutput, prefix)
        parent = _wrapped(parent, name)
    return parent, name, None


def _child(module: nn.Module, name: str) -> nn.Module:
    """A submodule by name, looking through peltbench's wrappers."""
    while name not in module._modules:
        module = _wrapped(module, name)
    return module._modules[name]


def _wrapped(module: nn.Module, name: str) -> nn.Module:
    """What a peltbench wrapper wraps (FfnOutput keeps it as `base`, the others as `inner`)."""
    if isinstance(module, FfnOutput):
        return module.base
    if "inner" in module._modules:
        return module.inner
    raise AttributeError(f"{type(module).__name__} has no {name}")


def frozen_projection(model: PeltModel, layer: nn.Module, target: str) -> nn.Module:
    """The pretrained Linear that computes `target` in a layer (ModernBERT: the whole fused Wqkv), under any deltas."""
    module = getattr(model.attention(layer), model.arch.projections[target][0])
    return frozen_linear(module.base if isinstance(module, FusedProjection) else module)


def projection_shape(model: PeltModel, layer: nn.Module, target: str) -> tuple[int, int]:
    """(out, in) of `target` in a layer: its row block's, in a fused projection."""
    out_features, in_features = frozen_projection(model, layer, target).weight.shape
    fused = model.arch.projections[target][1] is not None
    return (out_features // len(TARGETS) if fused else out_features), in_features


def install_deltas(model: PeltModel, users: dict[int, DictConfig], targets_key: str, make) -> list:
    """Put a delta on each targeted Linear (LINEARS) of every layer, for the members whose method lists it in
    `method[targets_key]`: `make(base, on_target, target, layer, in_features, out_features, block)` builds it.
    Returns (delta, on_target) per delta, in layer order."""
    made = []
    for index, layer in enumerate(model.layers):
        for target in LINEARS:
            on_target = {m: method for m, method in users.items() if target in method[targets_key]}
            if not on_target:
                continue
            parent, name, block = site(model, layer, target)
            projection = getattr(parent, name)
            if block is None:
                out_features, in_features = frozen_linear(projection).weight.shape
                delta = make(projection, on_target, target, index, in_features, out_features, None)
                setattr(parent, name, delta)
            else:
                if not isinstance(projection, FusedProjection):
                    projection = FusedProjection(projection)
                    setattr(parent, name, projection)
                out_features, in_features = frozen_linear(projection.base).weight.shape
                size = out_features // len(TARGETS)
                delta = make(getattr(projection, target, None), on_target, target, index, in_features, size,
                             slice(block * size, (block + 1) * size))
                projection.add_target(target, delta)
            made.append((delta, on_target))
    return made


def install(model: PeltModel, users: dict[int, DictConfig]) -> None:
    def make(base, on_target, target, layer, in_features, out_features, block):
        linear = frozen_projection(model, model.layers[layer], target)
        check_principal_rank(on_target, out_features, in_features)
        return LoRALinear(base, model.members, on_target, f"lora_{target}", layer, in_features, out_features, block,
                          linear)

    for lora, on_target in install_deltas(model, users, "lora_targets", make):
        trains_a = [m for m in on_target if not on_target[m].get("lora_freeze_a", False)]  # LoRA-FA: A stays frozen
        mark(model, [*lora.lora_a.parameters()], trains_a)
        mark(model, [*lora.lora_b.parameters()], on_target)
        mark(model, lora.coefficient.gate_parameters(), [m for m in on_target if on_target[m].get("gated", False)])


def init_member(model: PeltModel, slot: int, method: DictConfig) -> None:
    for delta in delta_modules(model, method.lora_targets, LoRALinear):
        delta.init_member(slot, method)


def frozen_state(model: PeltModel, slot: int, method: DictConfig) -> dict[str, torch.Tensor]:
    """LoRA-FA's A (frozen, so not in what the member trains), which a PEFT copy needs; PiSSA's / OLoRA's A₀, B₀."""
    state = initial_state(model, slot, method, LoRALinear)
    if method.get("lora_freeze_a", False):
        state.update({model.stored_name(f"{name}.lora_a.weight"): module.lora_a.weight[slot, : method.lora_rank]
                      for name, module in model.named_modules() if type(module) is LoRALinear and slot in module.users})
    return state


def initial_state(model: PeltModel, slot: int, method: DictConfig, kind: type) -> dict[str, torch.Tensor]:
    """A PiSSA / OLoRA member's frozen A₀ and B₀ on each `kind` delta (`<projection>.lora_a0`, `.lora_b0`): drawn
    again from W when a run is rebuilt, and what its PEFT copy (a LoRA of rank 2r on the original W) needs."""
    if not residual(method):
        return {}
    rank, state = method.lora_rank, {}
    for name, module in model.named_modules():
        if isinstance(module, kind) and slot in module.users:
            state[model.stored_name(f"{name}.lora_a0")] = module.lora_a0[slot, :rank]
            state[model.stored_name(f"{name}.lora_b0")] = module.lora_b0[slot, :, :rank]
    return state


def check_principal_rank(users: dict[int, DictConfig], out_features: int, in_features: int) -> None:
    """PiSSA / OLoRA take r singular (QR) vectors of the adapted W: r cannot exceed its smaller side."""
    for method in users.values():
        if residual(method) and method.lora_rank > min(out_features, in_features):
            raise ValueError(f"lora_init={method.lora_init} takes lora_rank={method.lora_rank} principal directions of "
                             f"a {out_features} × {in_features} projection, which has {min(out_features, in_features)}")


def check(method: DictConfig) -> None:
    unknown = sorted(set(method.lora_targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"lora_targets: unknown projection(s) {unknown}; choose from {list(TARGETS)}")
    init = method.get("lora_init", "kaiming")
    if init not in INITS:
        raise ValueError(f"lora_init must be one of {list(INITS)}, not {init!r}")
    if init != "kaiming" and method.get("gated", False):
        raise ValueError(f"method {method.name}: lora_init={init} takes s·B₀A₀ out of W, and a gate replaces s: "
                         "PiSSA and OLoRA run ungated (gated: false)")


def fused_targets(arch, targets) -> list[str]:
    """The `targets` (names of LINEARS) that are row blocks of a fused projection on this architecture (ModernBERT's
    Wqkv), which PEFT can only adapt whole (saving.peft_kind asks a component's `peft_refusal`)."""
    return [t for t in targets if t in arch.projections and arch.projections[t][1] is not None]
