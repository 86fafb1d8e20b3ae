"""The PELT methods, as components a method config lists (`conf/method/*.yaml: components`).

UniPELT is not a module of its own: `unipelt_apl` lists [adapter, prefix, lora] with `gated: true`,
reusing the single methods unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig
from torch import nn

from . import adapter, bitfit, full, ln, lora, parallel_adapter, prefix
from .base import PeltModel, freeze_all_but, head_parameters, parameter_counts

Attach = Callable[[PeltModel, DictConfig], list[nn.Parameter]]

COMPONENTS: dict[str, Attach] = {
    "full": full.attach,
    "bitfit": bitfit.attach,
    "ln": ln.attach,
    "adapter": adapter.attach,
    "prefix": prefix.attach,
    "lora": lora.attach,
    "parallel_adapter": parallel_adapter.attach,
}

HEAD_CHOICES = ("train", "bias", "frozen")


def build_pelt_model(backbone: nn.Module, method: DictConfig, model_seed: int) -> PeltModel:
    """Attach the method's components to a `BertForSequenceClassification` and freeze everything else.

    The model seed is set again before each component is built (App. B), so a submodule starts from the
    same weights alone or inside UniPELT.
    """
    check_method(method)
    model = PeltModel(backbone)
    trainable: list[nn.Parameter] = []
    for component in method.components:
        torch.manual_seed(model_seed)
        trainable += COMPONENTS[component](model, method)
    trainable += head_parameters(model, method.head)
    freeze_all_but(model, trainable)
    return model


def check_method(method: DictConfig) -> None:
    """Raise ValueError, naming the valid choices, for a component or head a method config cannot have."""
    unknown = [c for c in method.components if c not in COMPONENTS]
    if unknown:
        raise ValueError(f"method {method.name}: unknown component(s) {unknown}; known: {sorted(COMPONENTS)}")
    if method.head not in HEAD_CHOICES:
        raise ValueError(f"method {method.name}: head must be one of {list(HEAD_CHOICES)}, not {method.head!r}")


__all__ = ["COMPONENTS", "PeltModel", "build_pelt_model", "check_method", "parameter_counts"]
