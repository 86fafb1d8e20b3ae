"""The PELT methods, as components a method config lists (`conf/method/*.yaml: components`).

UniPELT is not a module of its own: `unipelt_apl` lists [adapter, prefix, lora] with `gated: true`,
reusing the single methods unchanged. A model carries the methods of a group of runs on one backbone
(base.py); a separate run is a group of one.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Sequence
from types import ModuleType

import torch
from omegaconf import DictConfig
from torch import nn

from ..architectures import SUPPORTED, architecture
from ..component import ComponentError, builtin_names, declaration, install_order, module_name
from . import randomness
from .attention import ATTENTION_NAME, install_relative_attention
from .base import Cloze, Members, PeltModel, check_marks, freeze_all_but_trained, mark

HEAD_CHOICES = ("train", "bias", "frozen")
GATE_POOLING = ("masked", "padded")


def component(name: str) -> ModuleType:
    """The module of component `name` (a built-in's short name, or a user's import path), imported once. Every
    component is reached through here, the built-ins as a user's: its declaration (`COMPONENT`) is read before torch
    by peltbench.component, its code here."""
    try:
        return importlib.import_module(module_name(name))
    except ImportError as error:
        raise ValueError(f"component {name}: its module cannot be imported ({error})") from None


# The built-in components, in the order they attach (their declarations' stage and `after`: peltbench.component).
COMPONENTS = {name: component(name) for name in builtin_names()}


def build_pelt_model(backbone: nn.Module, methods: DictConfig | Sequence[DictConfig], model_seed: int | Sequence[int],
                     heads: Sequence[nn.Module] | None = None, poolings: Sequence[str] | None = None,
                     cloze: Cloze | None = None) -> PeltModel:
    """Attach the methods of a group's members to one `*ForSequenceClassification` model (objective=cloze: one
    `*ForMaskedLM`) and freeze everything else.

    `methods` and `model_seed`: one per member (or a single method and seed: a separate run). `heads`: for each
    member, the model whose new head layers are its initial head (default: the backbone's own, for a group of one).
    `poolings` (the classifier objective): what each member's head reads, decided (objectives.classifier_pooling:
    head, pooler, first, mean or max; default head for all, as every record from before objectives ran).
    `cloze` (objective=cloze): the backbone is a `*ForMaskedLM`, each member's head its label words' decoder rows.
    Member m's new modules are drawn with the model seed set again before each of its components (App. B), so a
    member starts from the same weights alone, inside UniPELT, or inside any group.
    """
    methods = [methods] if isinstance(methods, DictConfig) else list(methods)
    seeds = [model_seed] * len(methods) if isinstance(model_seed, int) else list(model_seed)
    for method in methods:
        check_method(method)
    used = install_order(str(name) for method in methods for name in method.components)
    alone = [declaration(name).alone for name in used if declaration(name).alone]
    if len(methods) > 1 and alone:
        raise ValueError(alone[0])
    model = PeltModel(backbone, Members(len(methods)), list(heads or [backbone]),
                      None if poolings is None else list(poolings), cloze)
    model.members.padded_pooling = padded_pooling(methods)
    _own_attention(model)
    model.members.dropout_sites = randomness.install(model)
    for name in used:
        users = {m: method for m, method in enumerate(methods) if name in method.components}
        model._installing = name  # what it marks is its (check_marks names it)
        component(name).install(model, users)
        model.components.append(name)
    for slot, (method, seed) in enumerate(zip(methods, seeds)):
        for name in method.components:
            torch.manual_seed(seed)
            model._installing = str(name)
            component(str(name)).init_member(model, slot, method)
        model._installing = None
        mark(model, _head_parameters(model, method.head), [slot])
    marked_by = freeze_all_but_trained(model)
    check_marks(model, marked_by, lambda name: declaration(name).alone)
    check_stored(model, marked_by)
    return model


def _own_attention(model: PeltModel) -> None:
    """Attention computed by peltbench's function (methods/attention.py) in every layer: through transformers'
    attention interface, or, for DeBERTa, by `RelativeSelfAttention`."""
    if model.arch.relative_attention:
        install_relative_attention(model.encoder.encoder, model.layers, model.arch.attention, model.members)
    else:
        model.backbone.set_attn_implementation(ATTENTION_NAME)


def _head_parameters(model: PeltModel, head: str) -> list[nn.Parameter]:
    """The head parameters a method trains: `train` (all), `bias` (BitFit: its biases), `frozen` (prefix, LoRA)."""
    linears = model.head.linears().values()
    return {"train": [p for linear in linears for p in (linear.weight, linear.bias)],
            "bias": [linear.bias for linear in linears], "frozen": []}[head]


def padded_pooling(methods: Sequence[DictConfig]) -> bool:
    """Whether the group's gates average over every position of a batch padded to max length (the authors' code).

    A group cannot mix the two poolings (peltbench.fusion keeps them apart); methods without gates do not care.
    """
    poolings = {method.get("gate_pooling", "masked") for method in methods if method.get("gated", False)}
    if len(poolings) > 1:
        raise ValueError("a group cannot mix gate_pooling=masked and gate_pooling=padded")
    return poolings == {"padded"}


def check_method(method: DictConfig) -> None:
    """Raise ValueError, naming the valid choices, for a component or setting a method config cannot have: what the
    components declare (peltbench.component; the config was checked with the same before torch), then each module's
    own `check(method)`, where it has one."""
    names = [str(name) for name in method.components]
    unknown = [name for name in names if "." not in name and name not in COMPONENTS]
    if unknown:
        raise ValueError(f"method {method.name}: unknown component(s) {unknown}; known: {sorted(COMPONENTS)}")
    declared = {name: declaration(name) for name in names}
    if method.head not in HEAD_CHOICES:
        raise ValueError(f"method {method.name}: head must be one of {list(HEAD_CHOICES)}, not {method.head!r}")
    for first in names:
        for second, why in declared[first].excludes.items():
            if second in names:
                raise ValueError(f"method {method.name}: {first} with {second}: {why}")
    if method.get("gate_pooling", "masked") not in GATE_POOLING:
        raise ValueError(f"method {method.name}: gate_pooling must be one of {list(GATE_POOLING)}, not {method.gate_pooling!r}")
    if method.get("gated", False):
        check_gates(method)
    for name in names:  # a component's own settings (lora_targets ...), where it checks any
        if hasattr(component(name), "check"):
            component(name).check(method)


def check_gates(method: DictConfig) -> None:
    """A gated method's components each have a gate: their declaration says what it multiplies (`gate`), or None."""
    for name in method.components:
        if declaration(str(name)).gate is None:
            raise ValueError(f"method {method.name}: gated: true, but component {name} has no gate (a gate multiplies "
                             f"what a component adds to the frozen path; {name} declares none): "
                             f"set gated: false or leave {name} out")


# ---- training hooks: what a component may add to the loop (train.py calls them for every model)

def plan_training(model: PeltModel, total_steps: Sequence[int]) -> None:
    """Tell the components each member's planned number of optimiser steps (epochs × batches, stopping or not)."""
    for name in model.components:
        if hasattr(component(name), "plan"):
            component(name).plan(model, list(total_steps))


def regulariser(model: PeltModel) -> torch.Tensor | None:
    """What the components add to each active member's loss, (active members,), or None where none adds anything."""
    terms = [component(name).regulariser(model) for name in model.components
             if hasattr(component(name), "regulariser")]
    terms = [term for term in terms if term is not None]  # None: no active member has that term
    if not terms:
        return None
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def after_step(model: PeltModel, step: int) -> None:
    """After the optimiser's step `step` (0-based, the group's), before the gradients are cleared."""
    for name in model.components:
        if hasattr(component(name), "after_step"):
            component(name).after_step(model, step)


def component_state(model: PeltModel) -> dict[str, object]:
    """What components keep beside their parameters that training changes (a checkpoint holds it): `state(model)` of
    each component that declares one (AdaLoRA's budget: importance and masks); tensors as they are."""
    return {name: component(name).state(model) for name in model.components if hasattr(component(name), "state")}


def restore_components(model: PeltModel, states: dict[str, object]) -> None:
    """Put back a `component_state` (after `plan_training`): each component's `restore(model, state)`."""
    if set(states) != {name for name in model.components if hasattr(component(name), "state")}:
        raise ValueError(f"the checkpoint's component state ({sorted(states)}) is not this group's")
    for name, state in states.items():
        component(name).restore(model, state)


def parameter_counts(model: PeltModel, slot: int = 0) -> dict[str, int]:
    """Counts as docs/protocol.md defines them, for the member in `slot` of a model built for it alone.

    `trainable_params`: what must be stored per task, head excluded; a module that stores something other than its
    parameters says how much with `stored_numel(slot)` (the prefix encoder: its final L × 2 × layers × H tensor, not
    its MLP), counted instead of them for its `users` (and held to what it stores when built: `check_stored`).
    `head_params`: trainable head parameters. `optimizer_params`: everything the optimiser updates.
    """
    counts = {"trainable_params": 0, "head_params": 0, "optimizer_params": 0, "backbone_params": model.backbone_params}
    stored_otherwise = {f"{name}.": module for name, module in model.named_modules() if hasattr(module, "stored_numel")}
    for name, parameter, flags, stacked in model.member_parameters():
        if not flags[slot]:
            continue
        size = parameter[slot].numel() if stacked else parameter.numel()
        counts["optimizer_params"] += size
        if name.startswith("head."):
            counts["head_params"] += size
        elif not name.startswith(tuple(stored_otherwise)):
            counts["trainable_params"] += size
    for module in stored_otherwise.values():
        if slot in module.users:
            counts["trainable_params"] += module.stored_numel(slot)
    return counts


@torch.no_grad()
def check_stored(model: PeltModel, marked_by: dict[str, str | None]) -> None:
    """A module's `stored_numel(slot)`, what the counts say a member stores per task (parameter_counts), is what it
    stores: the tensors its `stored_state(slot)` gives (the prefix encoder: the member's prefix its MLP computes), or,
    where it has none, the tensors of it that the member trains. ComponentError naming the component and the module
    where they differ (a count in the record, peltbench-params and Table 4 that no tensor backs)."""
    trained = model.member_parameters()
    for name, module in model.named_modules():
        if not hasattr(module, "stored_numel"):
            continue
        own = [(key, parameter, flags, stacked) for key, parameter, flags, stacked in trained
               if key.startswith(f"{name}.")]
        owner = next((marked_by.get(key) for key, *_ in own if marked_by.get(key)), type(module).__module__)
        for slot in module.users:
            declared = module.stored_numel(slot)
            if hasattr(module, "stored_state"):
                stored, what = sum(t.numel() for t in module.stored_state(slot).values()), "its stored_state gives"
            else:
                stored = sum((p[slot] if stacked else p).numel() for _, p, flags, stacked in own if flags[slot])
                what = "the member trains of it (a module that stores something else says what: stored_state(slot))"
            if declared != stored:
                raise ComponentError(f"component {owner}: {model.stored_name(name)}.stored_numel({slot}) says "
                                     f"{declared:,} stored per task, but {what} {stored:,} (docs/components.md)")


def layout_key(method: DictConfig) -> tuple:
    """Where a run sits in its group: members with the same layout (a component's `layout(method)`: the prefix
    length) and components side by side, so a component's rows are mostly one slice of the batch (a view) rather
    than gathered (a copy)."""
    length = sum(component(name).layout(method) for name in method.components if hasattr(component(name), "layout"))
    return length, tuple(sorted(method.components)), bool(method.get("gated", False))


def added_tokens(method: DictConfig) -> int:
    """Positions a method adds to every row (a component's `added_tokens(method)`: prompt tuning's prompts)."""
    return sum(component(name).added_tokens(method) for name in method.components
               if hasattr(component(name), "added_tokens"))


def _alone(method: DictConfig, config, label_words: int | None = None) -> PeltModel:
    """The method built alone on a model of `config`'s shape, on the meta device (no weights, no time); with
    `label_words` (objective=cloze: how many), on its `*ForMaskedLM` with a cloze head of that many words."""
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    architecture(config.model_type)  # a ValueError naming the supported ones
    with torch.device("meta"):  # on a copy of the config: the model switches its attention function
        if label_words is None:
            return build_pelt_model(AutoModelForSequenceClassification.from_config(copy.deepcopy(config)), method, 42)
        cloze = Cloze((tuple(range(label_words)),), 0)
        return build_pelt_model(AutoModelForMaskedLM.from_config(copy.deepcopy(config)), method, 42, cloze=cloze)


def label_words(model: PeltModel) -> int | None:
    """How many label words a cloze model scores (None: a classifier)."""
    return None if model.mask_id is None else model.head.out.weight.shape[1]


def count_method(method: DictConfig, config, label_words: int | None = None) -> dict[str, int]:
    """A method's parameter counts for a model of `config`'s shape, as a separate run has them (`label_words`: with
    objective=cloze's head of that many words)."""
    return parameter_counts(_alone(method, config, label_words))


def member_shapes(method: DictConfig, config, label_words: int | None = None) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor the method trains, as a separate run has it, under the plain model's names."""
    model = _alone(method, config, label_words)
    return {model.stored_name(name): tuple(parameter.shape[1:] if stacked else parameter.shape)
            for name, parameter, _, stacked in model.member_parameters()}


def member_state(model: PeltModel, slot: int) -> dict[str, torch.Tensor]:
    """What member `slot` trains, one tensor per trained parameter, under the plain model's names
    (`bert.encoder.layer.0.output.LayerNorm.weight`, `bert.encoder.layer.0.output.adapter.down.weight`,
    `classifier.weight`, ...). Padded slots come back whole (zeros past the member's own size)."""
    state = {}
    for name, parameter, flags, stacked in model.member_parameters():
        if flags[slot]:
            state[model.stored_name(name)] = (parameter[slot] if stacked else parameter).detach().clone()
    return state


def member_frozen(model: PeltModel, slot: int, method: DictConfig) -> dict[str, torch.Tensor]:
    """What a copy of member `slot` needs beside what it trains: tensors drawn from its model seed and never trained
    (LoRA-FA's A, VeRA's shared A and B), from each component that has such (`frozen_state`), at the member's size."""
    state = {}
    for name in method.components:
        if hasattr(component(name), "frozen_state"):
            state.update(component(name).frozen_state(model, slot, method))
    return {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}


@torch.no_grad()
def load_member_state(model: PeltModel, slot: int, state: dict[str, torch.Tensor]) -> None:
    """Put a `member_state` back into `slot`."""
    for name, parameter, flags, stacked in model.member_parameters():
        if flags[slot]:
            (parameter[slot] if stacked else parameter).copy_(state[model.stored_name(name)])


def member_head(model: PeltModel, slot: int) -> dict[str, torch.Tensor]:
    """Member `slot`'s head, trained or not, under the names of the layers it replaces (`classifier.weight`, ...)."""
    return {model.stored_name(f"head.{name}"): parameter[slot].detach().clone()
            for name, parameter in model.head.named_parameters()}


@torch.no_grad()
def load_member_head(model: PeltModel, slot: int, state: dict[str, torch.Tensor]) -> None:
    """Put a `member_head` back into `slot`."""
    for name, parameter in model.head.named_parameters():
        parameter[slot].copy_(state[model.stored_name(f"head.{name}")])


__all__ = ["COMPONENTS", "SUPPORTED", "PeltModel", "added_tokens", "after_step", "build_pelt_model", "check_method",
           "component_state", "count_method", "label_words", "layout_key", "load_member_head", "load_member_state",
           "member_frozen", "member_head",
           "member_shapes", "member_state", "parameter_counts", "plan_training", "regulariser", "restore_components"]
