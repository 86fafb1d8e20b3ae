"""What every PELT method shares: the wrapper model, the gate, new-module init, freezing and counting.

A method is a list of components (`conf/method/*.yaml: components`). Each component attaches its modules
to the backbone and returns the parameters it trains; `build_pelt_model` freezes everything else.
"""

from __future__ import annotations

import torch
from torch import nn

INIT_STD = 0.02  # BERT's init for new Linear weights (METHODS.md); biases start at 0


def new_linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """A Linear initialised as BERT initialises its own: weight N(0, 0.02), bias 0."""
    linear = nn.Linear(in_features, out_features, bias=bias)
    nn.init.normal_(linear.weight, std=INIT_STD)
    if bias:
        nn.init.zeros_(linear.bias)
    return linear


class ForwardContext:
    """Per-forward state shared by the modules of one model: the padding mask, and optional gate statistics.

    Gates average over real tokens only, so they need the mask the backbone received; `PeltModel.forward`
    puts it here before calling the backbone.
    """

    def __init__(self) -> None:
        self.token_mask: torch.Tensor | None = None
        self._gate_sums: dict[tuple[str, int], list[float]] | None = None

    def start_gate_recording(self) -> None:
        self._gate_sums = {}

    def observe_gate(self, submodule: str, layer: int, values: torch.Tensor) -> None:
        if self._gate_sums is not None:
            total = self._gate_sums.setdefault((submodule, layer), [0.0, 0])
            total[0] += float(values.float().sum())
            total[1] += values.numel()

    def stop_gate_recording(self) -> dict[str, list[float]] | None:
        """Mean gate value per submodule and layer over everything seen since `start_gate_recording`."""
        sums, self._gate_sums = self._gate_sums, None
        if not sums:
            return None
        layers = 1 + max(layer for _, layer in sums)
        means: dict[str, list[float]] = {}
        for (submodule, layer), (total, count) in sorted(sums.items()):
            means.setdefault(submodule, [float("nan")] * layers)[layer] = total / count
        return means


class Gate(nn.Module):
    """UniPELT's gate (§3.2): g = mean over real tokens t of sigmoid(Linear_H→1(x_t)).

    One scalar in (0, 1) per example, per layer, per submodule, computed from the submodule's own input.
    The mean is masked (METHODS.md "Gates: one shape everywhere"), so g does not depend on padding.
    """

    def __init__(self, hidden_size: int, context: ForwardContext, submodule: str, layer: int) -> None:
        super().__init__()
        self.linear = new_linear(hidden_size, 1)
        self.context = context
        self.submodule = submodule
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, tokens, hidden) → g: (batch,)."""
        per_token = torch.sigmoid(self.linear(x)).squeeze(-1)
        mask = self.context.token_mask
        if mask is None:
            gate = per_token.mean(dim=1)
        else:
            mask = mask.to(per_token.dtype)
            gate = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        self.context.observe_gate(self.submodule, self.layer, gate.detach())
        return gate


def maybe_gate(gated: bool, hidden_size: int, context: ForwardContext, submodule: str, layer: int) -> Gate | None:
    return Gate(hidden_size, context, submodule, layer) if gated else None


class PeltModel(nn.Module):
    """A `BertForSequenceClassification` with PELT modules attached; forward returns the logits."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.context = ForwardContext()
        # The denominator of Table 4's "% of the backbone": the pretrained encoder, pooler included.
        self.backbone_params = sum(p.numel() for p in backbone.bert.parameters())

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.bert.encoder.layer

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.context.token_mask = attention_mask
        try:
            output = self.backbone(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        finally:
            self.context.token_mask = None
        return output.logits


def head_parameters(model: PeltModel, head: str) -> list[nn.Parameter]:
    """The classifier parameters a method trains: `train` (all), `bias` (BitFit), `frozen` (prefix, LoRA)."""
    classifier = model.backbone.classifier
    choices = {"train": list(classifier.parameters()), "bias": [classifier.bias], "frozen": []}
    return choices[head]


def freeze_all_but(model: nn.Module, trainable: list[nn.Parameter]) -> None:
    """The one place that decides requires_grad: the method's parameters train, nothing else does."""
    keep = {id(p) for p in trainable}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in keep)


def parameter_counts(model: PeltModel) -> dict[str, int]:
    """Counts as METHODS.md defines them.

    `trainable_params`: what must be stored per task, head excluded; a module with `stored_numel()` (the
    prefix encoder, whose MLP is discarded after training) counts that instead of its parameters.
    `head_params`: trainable head parameters. `optimizer_params`: everything the optimiser updates.
    """
    head_ids = {id(p) for p in model.backbone.classifier.parameters()}
    replaced: set[int] = set()
    stored = 0
    for module in model.modules():
        if hasattr(module, "stored_numel") and any(p.requires_grad for p in module.parameters()):
            stored += module.stored_numel()
            replaced.update(id(p) for p in module.parameters())
    trainable = [p for p in model.parameters() if p.requires_grad]
    stored += sum(p.numel() for p in trainable if id(p) not in head_ids and id(p) not in replaced)
    return {
        "trainable_params": stored,
        "head_params": sum(p.numel() for p in trainable if id(p) in head_ids),
        "optimizer_params": sum(p.numel() for p in trainable),
        "backbone_params": model.backbone_params,
    }


def self_attention(layer: nn.Module) -> nn.Module:
    """The layer's `BertSelfAttention`, whether or not prefix-tuning has wrapped it."""
    module = layer.attention.self
    return getattr(module, "inner", module)


def plain_ffn_output(layer: nn.Module, method: str) -> nn.Module:
    """The layer's `BertOutput`; two FFN adapters in one layer are not a combination any method defines."""
    output = layer.output
    if not hasattr(output, "dense") or not hasattr(output, "LayerNorm"):
        raise ValueError(f"{method}: layer.output is already wrapped by another FFN adapter")
    return output
