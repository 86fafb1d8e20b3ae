"""Checks of a composed config that answer at once: `peltbench` runs them before Hydra starts a run, so a bad value
costs a second, not a torch import (docs/command-line.md, "Config errors"). The runner calls `check_config` again.

Only omegaconf and the packaged YAML files are used here: nothing that imports torch or transformers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from importlib.util import find_spec

from omegaconf import DictConfig, ListConfig, OmegaConf

from . import UserError
from .component import (LAYER_LINEARS, PROJECTION_NAMES, Component, ComponentError, builtin_files, builtin_names,
                        declaration, evaluate, is_builtin)
from .objectives import check_objective, model_misfit as objective_misfit
from .packaged import options, packaged_config
from .passes import once
from .protocols import DEV_SOURCES, K_COUNTS, SELECTION, STATISTICS, protocol_settings, run_defaults
from .cloze import check_architecture as check_cloze_model, check_prompt, is_cloze, prompt_of
from .tasks import CLOZE_KEYS, DATASET_KEYS, FILES_KEYS, FORMATS, METRICS, REGRESSION_METRICS, TASK_KEYS, files_layouts

HEAD_CHOICES = ("train", "bias", "frozen")   # what of the classifier head trains
PRECISIONS = ("auto", "bf16", "fp32")
DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")

# bf16 on a CPU (issue 15, item 9), LoRA on SST-2 with MiniLM, the same scores: 1.5-2.2x slower than fp32 on an Intel
# Xeon without AMX (scripts/benchmark_precision.py; its bf16 GEMMs take 1.9x fp32's time, and they are 90% of the
# difference), 8x on an AMD EPYC with avx512_bf16 (the issue's own runs).
CPU_BF16 = ("precision=bf16 is refused on a CPU: peltbench trains slower there in bf16 than in fp32 (1.5-2x measured) "
            "to the same scores (scripts/benchmark_precision.py measures yours); use precision=fp32 or a GPU")

# The settings every method has. What else a method reads is what its components declare (peltbench.component: each
# component module's COMPONENT); a setting no component of the method reads would only rename the run's folder
# (+method.lora_rank=4 on an adapter), so it is refused.
COMMON_SETTINGS = ("name", "components", "head", "lr")

# The optional dependency (module to import = extra to install) of each logger in conf/logger/.
LOGGER_EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value) -> bool:
    return _is_int(value) and value > 0


def _non_negative_int(value) -> bool:
    return _is_int(value) and value >= 0


def _positive_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value) and value > 0


def _fraction(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and 0 <= value < 1


def _open_unit(value) -> bool:
    return isinstance(value, float) and 0 < value < 1


def _text(value) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _bool(value) -> bool:
    return isinstance(value, bool)


def _optional_positive_int(value) -> bool:
    return value is None or _positive_int(value)


Rule = tuple[Callable[[object], bool], str]  # (is the value valid, what it must be)
POSITIVE_INT: Rule = (_positive_int, "must be a positive integer")
OPTIONAL_INT: Rule = (_optional_positive_int, "must be a positive integer or null")
BOOL: Rule = (_bool, "must be true or false")

# Every value outside `method`, `task` and `logger` that a run reads. Keys the packaged conf/config.yaml lacks
# (fuse, save.*) are checked when a config has them.
SETTINGS: dict[str, Rule] = {
    "k": (lambda v: v == "all" or _positive_int(v),
          "must be a positive number of training examples (100, 500, 1000) or 'all'"),
    "seed": (_non_negative_int, "must be a non-negative integer"),
    "model_seed": (_non_negative_int, "must be a non-negative integer"),
    "dev_size": POSITIVE_INT,
    "model.name": (_text, "must be a Hub id or a local checkpoint directory"),
    "data.dir": (lambda v: v is None or _text(v),
                 "must be a folder (a local GLUE copy, or the one a task file's relative files are under), or null for "
                 "the Hub"),
    "train.epochs": (_optional_positive_int, "must be a positive integer, or null with train.max_steps set"),
    "train.max_steps": OPTIONAL_INT,
    "train.eval_every": OPTIONAL_INT,
    "train.patience": (_optional_positive_int, "must be a positive integer, or null: no early stopping"),
    "train.batch_size": POSITIVE_INT,
    "train.max_length": POSITIVE_INT,
    "train.grad_clip": (_positive_number, "must be a positive number (the gradient-norm limit)"),
    "train.eval_batch_size": POSITIVE_INT,
    "train.checkpoint_every": (lambda v: v is None or _positive_number(v),
                               "must be a positive number of minutes, or null: no checkpoints on a timer"),
    "results_dir": (_text, "must be a directory"),
    "device": (lambda v: isinstance(v, str) and DEVICE.fullmatch(v) is not None,
               "must be auto, cpu, cuda, cuda:N or mps"),
    "precision": (lambda v: v in PRECISIONS, f"must be {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}"),
    "fuse": BOOL,
    "fuse_members": POSITIVE_INT,
    "halving": (lambda v: v is None or (_positive_int(v) and v >= 2),
                "must be null (off) or an integer η of at least 2 (successive halving keeps the top 1/η at each rung)"),
    "halving_first": (_positive_int, "must be a positive integer: the dev evaluation of halving's first rung"),
    "save.weights": BOOL,
    "save.predictions": BOOL,
}

METHOD_SETTINGS: dict[str, Rule] = {  # the common ones; the components' own: method_settings()
    "name": (_text, "must be a name"),
    "lr": (_positive_number, "must be a positive number (the learning rate)"),
    "head": (lambda v: v in HEAD_CHOICES, f"must be one of {', '.join(HEAD_CHOICES)}"),
}


def method_settings() -> dict[str, tuple[Rule, str]]:
    """Every setting a built-in component reads, with its rule and help line, in the order the components attach
    (peltbench --help lists them)."""
    found: dict[str, tuple[Rule, str]] = {}
    for name in builtin_names():
        for key, setting in declaration(name).all_settings().items():
            found.setdefault(key, (setting.rule, setting.help))
    return found


# Methods whose default setting (their conf/method file) did not learn in peltbench's few-shot measurement
# (docs/defaults.md: MiniLM, SST-2, K = 500, seed 111, dev 200, 5 epochs): a few-shot run at it is warned at its start
# (runner), naming the few-shot setting peltbench's own selection on dev chose there (a fused lr grid,
# `peltbench-tables --select method.lr`). The default stays as it is, so `method=NAME` keeps its meaning, hash and
# folder, and the few-shot setting, an override, has a folder of its own (road,lr=0.01). Each entry: the default values
# that did not learn and where they come from, the setting chosen on dev, what was measured, and `steps`: the training
# the measurement covers (a run that plans more, or an unknown number, is warned too, and told that its length was
# not measured).
FULL_DATA = "its paper's full-data setting"
LORAS_RATE = "LoRA's App. B rate, a like-for-like departure"
FEW_SHOT: dict[str, dict] = {
    "road": {"default": {"lr": 1.0e-3}, "source": FULL_DATA, "chosen": {"lr": 1.0e-2}, "steps": 160,
             "measured": "test accuracy 51.49 against the majority class's 50.92; lr 1e-2: 77.29"},
    "c3a": {"default": {"lr": 2.0e-1}, "source": FULL_DATA, "chosen": {"lr": 1.0}, "steps": 160,
            "measured": "test accuracy 51.03 against the majority class's 50.92; lr 1: 75.11"},
    "adalora": {"default": {"lr": 8.0e-4}, "source": "its scripts' full-data median", "chosen": {"lr": 1.0e-2},
                "steps": 160, "measured": "test accuracy 50.92 against the majority class's 50.92; lr 1e-2: 78.10"},
    "lora_fa": {"default": {"lr": 5.0e-4}, "source": LORAS_RATE, "chosen": {"lr": 1.0e-2}, "steps": 160,
                "measured": "test accuracy 51.61 against the majority class's 50.92; lr 1e-2: 74.54"},
    "vera": {"default": {"lr": 5.0e-4}, "source": LORAS_RATE, "chosen": {"lr": 5.0e-2}, "steps": 160,
             "measured": "test accuracy 47.02 against the majority class's 50.92; lr 5e-2: 77.98"},
    "oft": {"default": {"lr": 5.0e-4}, "source": LORAS_RATE, "chosen": {"lr": 2.0e-3}, "steps": 160,
            "measured": "test accuracy 54.82 against the majority class's 50.92; lr 2e-3: 78.21"},
    "hra": {"default": {"lr": 5.0e-4}, "source": LORAS_RATE, "chosen": {"lr": 1.0e-2}, "steps": 160,
            "measured": "test accuracy 51.03 against the majority class's 50.92; lr 1e-2: 79.24"},
    "boft": {"default": {"lr": 5.0e-4}, "source": LORAS_RATE, "chosen": {"lr": 1.0e-2}, "steps": 160,
             "measured": "test accuracy 51.03 against the majority class's 50.92; lr 1e-2: 79.13"},
}


def few_shot_warning(cfg: DictConfig) -> str | None:
    """One line for a few-shot run (k not `all`) of a FEW_SHOT method at the default values that did not learn, or
    None: what was measured, in how many steps, the few-shot setting chosen on dev, and whether this run plans more
    training than was measured."""
    name = cfg.method.get("name")
    entry = FEW_SHOT.get(name)
    if cfg.get("k") == "all" or entry is None:
        return None
    if any(cfg.method.get(key) != value for key, value in entry["default"].items()):
        return None
    at = ", ".join(f"{key} {value:g}" for key, value in entry["default"].items())
    use = " ".join(f"method.{key}={value:g}" for key, value in entry["chosen"].items())
    steps, measured = planned_steps(cfg), entry["steps"]
    longer = ("" if steps is not None and steps <= measured else
              f"; this run plans {steps:,} steps, a length not measured" if steps is not None else
              "; this run's length was not measured")
    return (f"method={name} at its default {at} ({entry['source']}) did not learn in peltbench's few-shot "
            f"measurement ({entry['measured']}; MiniLM, SST-2, K=500, {measured} steps: docs/defaults.md{longer}); "
            f"the setting chosen on dev there: {use}")


_ABSENT = object()
SHORTEST_ROW = 3  # positions the shortest row takes: [CLS], one word, [SEP]


class ModelMisfit(UserError):
    """A run that its model cannot take (check_model_fit): refused before torch where the model's config.json can be
    read then; found once the run has started (a Hub model's config loaded, the rows tokenised), its failed record
    says why (peltbench.runner)."""


def check_config(cfg: DictConfig) -> None:
    """Raise UserError, in one line naming the key, for a value or key that a run cannot have.

    A check of one node (the task, the method, train, a top-level value, the protocol, the objective, the loggers)
    is asked through passes.once: in a sweep's pass, once per distinct node, which the sweep's runs share; what
    relates a run's nodes (k and the protocol, halving and fuse, the method and the model's config.json) is checked
    for every run."""
    for key in ("method", "task"):
        if cfg.get(key) is None or cfg[key].get("name") is None:  # a protocol may set method.head without a method
            raise UserError(f"{key}= is required: one of {', '.join(options(key))}")
    check_known_keys(cfg)
    plain = isinstance(cfg, dict)
    for top, settings, check in _SETTING_GROUPS:
        if plain:  # a top-level node (train, save, ...) or value (k, seed, ...)
            once(check, cfg.get(top, _ABSENT))
        else:
            _check_settings(cfg, settings)
    once(check_task, cfg.task)
    once(check_schedule, cfg.train)
    check_protocol(cfg)
    check_objective(cfg)
    check_halving(cfg)
    if cfg.get("precision") == "bf16" and cfg.get("device") == "cpu":  # device=auto: runner.resolve_device
        raise UserError(CPU_BF16)
    once(check_method, cfg.method)
    check_planned_steps(cfg)
    check_model_fit(cfg, local_model_config(str(cfg.get("model", {}).get("name", ""))))
    if is_cloze(cfg):
        check_cloze(cfg)
    once(check_logger, cfg.get("logger"))


def check_cloze(cfg: DictConfig) -> None:
    """objective=cloze: its prompt (template, label words' classes) and a model that has a masked-LM head, before
    torch (peltbench.cloze); its label words' being one token each is checked with the tokenizer (runner)."""
    from .tasks import TaskSpec

    task = once(TaskSpec.from_config, cfg.task)
    check_prompt(prompt_of(cfg, task), task)
    if cfg.objective.get("demonstrations"):
        from .demonstrations import check_demonstrations  # the data's side of the objective: no torch

        check_demonstrations(cfg, task)
    name = str(cfg.get("model", {}).get("name", ""))
    once(_check_cloze_model, name)


def _check_cloze_model(name: str) -> None:
    check_cloze_model(name, local_model_config(name))


def _check_settings(cfg: DictConfig, settings: list) -> None:
    """The SETTINGS under one top-level key of a DictConfig."""
    for key, _, rule in settings:
        _check_setting(key, _select(cfg, key), rule)


def _check_setting(key: str, value, rule: Rule) -> None:
    valid, must = rule
    if value is not _ABSENT and not valid(value):
        raise UserError(f"{key}={_show(value)}: {must}")


def _settings_check(settings: list) -> Callable:
    """The check of the SETTINGS under one top-level key of plain data, given the value there (_ABSENT: none)."""
    def check(node) -> None:
        for key, path, rule in settings:
            _check_setting(key, _at(node, path[1:]), rule)
    return check


def _setting_groups() -> list[tuple[str, list, Callable]]:
    """(top-level key, its SETTINGS as (key, path, rule), their check on plain data), in SETTINGS' order."""
    paths = [(key, tuple(key.split(".")), rule) for key, rule in SETTINGS.items()]
    groups = []
    for top in dict.fromkeys(path[0] for _, path, _ in paths):
        group = [entry for entry in paths if entry[1][0] == top]
        groups.append((top, group, _settings_check(group)))
    return groups


_SETTING_GROUPS = _setting_groups()


def local_model_config(name: str) -> dict | None:
    """The model's config.json, read without torch and without the network: a local checkpoint's, or a Hub model's
    where the Hugging Face cache holds it; None otherwise (then check_model_fit runs when the run has loaded the
    config, before any weights). Inside one_pass() (a sweep's check) looked up once per name."""
    return once(_local_model_config, name)


def _local_model_config(name: str) -> dict | None:
    import os
    import stat

    if not name:
        return None
    path = os.path.join(os.path.expanduser(name), "config.json")
    try:
        found = os.stat(path)
    except OSError:
        found = None
    if found is None or not stat.S_ISREG(found.st_mode):  # not a local checkpoint's file (os.path.isfile)
        path = _cached_hub_config(name)
        if path is None:
            return None
        try:
            found = os.stat(path)
        except OSError:
            return None
    return _read_model_config(path, found.st_mtime_ns, found.st_size)  # read again only when the file changed


@lru_cache(maxsize=64)
def _read_model_config(path: str, mtime_ns: int, size: int) -> dict | None:
    """config.json at `path` as it was at (`mtime_ns`, `size`): a sweep checks every run, of a few models. Never
    change what it returns."""
    import json

    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None  # the model's own loading says what is wrong with it


@lru_cache(maxsize=64)
def _cached_hub_config(name: str) -> str | None:
    """Where the Hugging Face cache holds the config.json of Hub model `name` (its main revision), or None. Looked up
    once per name (a sweep checks each of its runs): a file that went since is then not found (os.stat), one that came
    since is read when the run loads its model (check_model_fit runs then)."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        return None  # a local path that is not there: not a Hub id
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # an id the cache cannot hold, an unreadable cache: the run loads the config itself
        return None
    return found if isinstance(found, str) else None


def linear_sizes(target: str, model_config: dict) -> tuple[int | None, int | None, str, str]:
    """(input size, output size, what in config.json gives each) of a layer's `target` Linear (a name of
    component.LAYER_LINEARS), from the config alone; None where it does not say (an architecture peltbench does not
    know, for the FFN's Linears)."""
    from .architectures import ARCHITECTURES, output_size

    hidden = model_config.get("hidden_size")
    if target in PROJECTION_NAMES or target == "attention_output":
        return hidden, hidden, f"hidden_size {hidden}", f"hidden_size {hidden}"
    arch = ARCHITECTURES.get(model_config.get("model_type"))
    if arch is None:
        return None, None, "", ""
    if target == "output":
        size = model_config.get("intermediate_size")
        return size, hidden, f"intermediate_size {size}", f"hidden_size {hidden}"
    size, source = output_size(arch, target, model_config)
    return hidden, size, f"hidden_size {hidden}", source


def fit_misfit(method: DictConfig, components: list, model_config: dict) -> str | None:
    """Why a component's settings do not fit a Linear it adapts (its declared `fits`: OFT's block size dividing the
    input, a rank no larger than the projection's, ...), with what in config.json gave the sizes; None where each
    fits or the config does not say."""
    for name in components:
        component = declaration(name)
        for fit in component.fits:
            targets = [str(t) for t in method[fit.targets]] if fit.targets else PROJECTION_NAMES
            for target in LAYER_LINEARS:
                if target not in targets:
                    continue
                features, out_features, in_source, out_source = linear_sizes(target, model_config)
                if features is None or out_features is None:
                    continue
                names = component.values(method, in_features=int(features), out_features=int(out_features),
                                         target=target)
                why = fit.refusal(names)
                if why:
                    source = {"in": in_source, "out": out_source}.get(
                        fit.sides, in_source if in_source == out_source else f"{in_source}, {out_source}")
                    return f"{why} ({model_config.get('model_type')} {source})"
    return None


def check_model_fit(cfg: DictConfig, model_config: dict | None, longest: int | None = None) -> None:
    """What the method needs of the model, from its config (config.json) alone. Before torch where config.json can be
    read then (local_model_config), else once the run has loaded it: what its components' declarations need of each
    Linear they adapt (`fits`: rotation block sizes that divide its width, ranks no larger than the projections they
    adapt ...), and room for a row's tokens after whatever comes before them (a prompt, a P-tuning v2 prefix's shift:
    `positions`; RoBERTa's offset).
    Given the run's `longest` tokenised row (the runner, once the run's data is tokenised: a position table a test
    model makes short is no reason to refuse a run whose rows fit), every row's positions within its position table.
    Raises ModelMisfit (a UserError)."""
    if model_config is None:
        return
    method, run = cfg.method, f"method={cfg.method.get('name')} task={cfg.task.get('name')}"
    components = [str(name) for name in method.get("components") or []]
    why = fit_misfit(method, components, model_config) or objective_misfit(cfg, model_config)
    if why:
        raise ModelMisfit(f"{run}: {why}")
    from .architectures import ARCHITECTURES

    arch = ARCHITECTURES.get(model_config.get("model_type"))
    table = model_config.get("max_position_embeddings")
    if arch is None or arch.positions is None or not table:
        return
    if arch.positions_if and not model_config.get(arch.positions_if, True):
        return
    table = int(table)
    extra = []  # (what, how many) of the positions components put before the text (prompts, a shifted prefix)
    for name in components:
        component = declaration(name)
        positions = component.positions
        if positions is not None and (positions.when is None or evaluate(positions.when, component.values(method))):
            note = f" ({positions.note})" if positions.note else ""
            extra.append((f"{positions.count}{note}", int(method[positions.count])))
    offset = int(model_config.get("pad_token_id") or 0) + 1 if arch.positions == "after_padding_idx" else 0
    before_text = [*(f"{key} {n}" for key, n in extra), *([f"RoBERTa's offset {offset}"] if offset else [])]
    room = table - sum(n for _, n in extra) - offset  # positions left for a row's own tokens
    if extra and room < SHORTEST_ROW:  # the config alone decides it: no row fits, however short
        used = table - room
        keys = " or ".join(f"method.{key.split()[0]}" for key, _ in extra)
        raise ModelMisfit(f"{run}: {' + '.join(before_text)}{f' = {used}' if len(before_text) > 1 else ''} positions "
                          f"come before the text, but the model has {table} (max_position_embeddings): "
                          f"{'none' if room <= 0 else f'only {room}'} left for the text (a row takes at least "
                          f"{SHORTEST_ROW}); lower {keys}")
    if longest is None:
        return
    length = int(longest)
    if length > room:
        parts = " + ".join([f"the longest row's {length} tokens", *before_text])
        raise ModelMisfit(f"{run}: {parts} = {length + table - room} positions, but the model has {table} "
                          f"(max_position_embeddings): set train.max_length={room} or lower")


def check_method(method: DictConfig) -> None:
    """The method's components are known, it has the settings they read and no others, and each value is valid: as
    the components declare them (peltbench.component), checked before torch."""
    components, declared = method_components(method)
    for first in components:
        for second, why in declared[first].excludes.items():
            if second in components:
                raise UserError(f"method.components={_show(components)}: {first} with {second}: {why}")
    settings = shared_settings(components, declared)
    read = set(COMMON_SETTINGS).union(*(declared[name].read(method) for name in components))
    unknown = sorted(set(method.keys()) - read)
    unread = [key for key in unknown if key in settings]  # declared, but not read with these settings
    if unread:
        raise UserError(f"method.{unread[0]}: {settings[unread[0]].unread}; remove it (~method.{unread[0]})")
    if unknown:
        raise UserError(f"method.{unknown[0]}: not a setting of method {method.get('name')} (components "
                        f"{_show(components)}); its settings: {', '.join(sorted(read))}")
    missing = sorted(read - set(method.keys()) - {key for key, setting in settings.items() if setting.optional})
    if missing:
        raise UserError(f"method.{missing[0]}: missing; components {_show(components)} need it "
                        f"(add +method.{missing[0]}=VALUE)")
    rules = {**METHOD_SETTINGS, **{key: setting.rule for key, setting in settings.items()}}
    for key, (valid, must) in rules.items():
        if key in method and not valid(method[key]):
            raise UserError(f"method.{key}={_show(method[key])}: {must}")
    gateless = [name for name in components if declared[name].gate is None]
    if method.get("gated") and gateless:
        raise UserError(f"method {method.get('name')}: gated: true, but component {gateless[0]} has no gate (a gate "
                        f"multiplies what a component adds to the frozen path): set gated: false or leave "
                        f"{gateless[0]} out")
    for name in components:
        refused = declared[name].refusals(method, declared[name].checks)
        if refused:
            raise UserError(refused[0])


def method_components(method: DictConfig) -> tuple[list[str], dict[str, Component]]:
    """The method's components and their declarations; a UserError for a list that is not one of distinct known
    components (a built-in's name, or a module's import path)."""
    components = method.get("components")
    if not (_distinct_list(components) and components):
        raise UserError(f"method.components={_show(components)}: must be a list of distinct components from "
                        f"{', '.join(builtin_names())}, or a module's import path (docs/components.md)")
    components = [str(name) for name in components]
    declared = {}
    for name in components:
        if is_builtin(name) and name not in builtin_files():
            raise UserError(f"method.components={_show(components)}: must be a list of distinct components from "
                            f"{', '.join(builtin_names())}, or a module's import path (docs/components.md)")
        try:
            declared[name] = declaration(name)
        except ComponentError as error:
            raise UserError(f"method.components={_show(components)}: {error}") from None
    return components, declared


def shared_settings(components: list[str], declared: dict[str, Component]) -> dict:
    """Every setting the components declare, by key. Settings are method keys, so two components may read one
    (lora and dora: lora_rank) only where they declare it alike (rule, default, condition): else a UserError."""
    settings, owners = {}, {}
    for name in components:
        for key, setting in declared[name].all_settings().items():
            if key in settings and not settings[key].agrees(setting):
                raise UserError(f"method.components={_show(components)}: {owners[key]} and {name} both read "
                                f"method.{key}, declared differently ({settings[key].rule.must}, default "
                                f"{settings[key].default}; {setting.rule.must}, default {setting.default}): one of them "
                                f"must name it otherwise")
            settings.setdefault(key, setting)
            owners.setdefault(key, name)
    return settings


def planned_steps(cfg: DictConfig) -> int | None:
    """The optimiser steps a run plans (train.max_steps, or epochs × ceil(train rows / batch), as train.fit plans them),
    from the config alone; None where the train rows are not known before the data is read (k=all)."""
    if cfg.train.get("max_steps") is not None:
        return int(cfg.train.max_steps)
    k = cfg.get("k")
    if not isinstance(k, int) or cfg.train.get("epochs") is None:
        return None
    node = cfg.get("protocol")
    rows = k * max(int(cfg.task.get("num_labels", 1)), 2) if node is not None and node.get("k") == "per_class" else k
    return int(cfg.train.epochs) * math.ceil(rows / int(cfg.train.batch_size))


def planned_work(cfg: DictConfig) -> float | None:
    """What a run costs, roughly, from its config alone: the token positions it puts through the encoder, a training
    row's counted three times (forward and backward) and each dev evaluation's row once, at max_length. A sweep on
    several devices hands out its longest groups first by it (peltbench.workers). An upper bound where early stopping
    ends a run sooner; None where the train rows are not known before the data is read (k=all)."""
    steps = planned_steps(cfg)
    if steps is None:
        return None
    train = cfg.train
    node = cfg.get("protocol")
    classes = max(int(cfg.task.get("num_labels", 1)), 2)
    dev_rows = cfg.k * classes if node is not None and node.get("dev") == "per_class" else int(cfg.dev_size)
    evaluations = steps // int(train.eval_every) if train.get("eval_every") else int(train.epochs or 1)
    return float(train.max_length) * (3 * steps * int(train.batch_size) + evaluations * dev_rows)


def check_halving(cfg: DictConfig) -> None:
    """Successive halving (peltbench.halving) compares a fused group's runs, at a rung before the run's end."""
    eta, first = cfg.get("halving"), cfg.get("halving_first", 1)
    if eta is None:
        if first != 1:
            raise UserError(f"halving_first={first}: the first rung of successive halving; set halving=η too")
        return
    if not cfg.get("fuse", False):
        raise UserError(f"halving={eta}: successive halving compares the runs of a fused group; add fuse=true")
    train = cfg.train
    evaluations = train.epochs if train.epochs is not None else train.max_steps // train.eval_every
    if first >= evaluations:
        raise UserError(f"halving={eta} halving_first={first}: a run of {evaluations} dev evaluation"
                        f"{'s' if evaluations != 1 else ''} has no rung before its end (halving would compare nothing); "
                        f"lower halving_first or train longer")


def check_planned_steps(cfg: DictConfig) -> None:
    """What a component's declaration needs of the run's planned optimiser steps (`schedule`: AdaLoRA's schedule
    leaves a budgeting phase; methods/adalora_budget.py plans the same rounding): refused before torch, naming the run,
    rather than when its group is planned."""
    method = cfg.method
    declared = once(_scheduled, method)  # a sweep's runs share their method node per lr
    total = planned_steps(cfg) if declared else None
    if total is None:
        return
    for name, component in declared:
        refused = component.refusals(method, component.schedule, steps=total)
        if refused:
            raise UserError(f"method={method.name} task={cfg.task.name}: {name}: {refused[0]}")


def _scheduled(method: DictConfig | Mapping) -> list:
    """[(name, declaration)] of the method's components whose declaration needs the run's planned steps."""
    return [(str(name), declaration(str(name))) for name in method.get("components") or []
            if declaration(str(name)).schedule]


TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a folder of the results (record_path)


def _column(value) -> bool:
    return _text(value) or _non_negative_int(value)


def _columns(value) -> bool:
    return _distinct_list(value) and len(value) in (1, 2) and all(_column(v) for v in value)


def check_task(task: DictConfig | Mapping) -> None:
    """A task file's values (docs/tasks.md), from the file alone: its columns, classes, metrics and where its rows
    are. What its data holds (the columns there, the labels, the rows) is checked when the data is read
    (peltbench.data.check_task_data, before the first run of a sweep)."""
    name = task.get("name")
    if not (isinstance(name, str) and TASK_NAME.fullmatch(name)):
        raise UserError(f"task.name={_show(name)}: must be a name of letters, digits, '.', '_' and '-' (its results' "
                        f"folder)")
    where = f"task={name}: task"
    missing = [key for key in ("text", "label", "num_labels", "metrics", "main_metric", "max_length")
               if task.get(key) is None]
    if missing:
        raise UserError(f"{where}.{missing[0]}: missing (docs/tasks.md)")
    if not _columns(task.text):
        raise UserError(f"{where}.text={_show(task.text)}: must be a list of one text column, or two (a sentence pair): "
                        f"names, or 0-based indices in a file without a header")
    if not _column(task.label):
        raise UserError(f"{where}.label={_show(task.label)}: must be the label column's name (or 0-based index)")
    labels = task.num_labels
    if not _positive_int(labels):
        raise UserError(f"{where}.num_labels={_show(labels)}: must be the number of classes, or 1 for a regression "
                        f"task (one output, MSE loss)")
    _check_labels(task, where, labels)
    _check_metrics(task, where, labels)
    if not _positive_int(task.max_length):
        raise UserError(f"{where}.max_length={_show(task.max_length)}: must be a positive number of tokens")
    if not _bool(task.get("lmbff_chained", False)):
        raise UserError(f"{where}.lmbff_chained={_show(task.lmbff_chained)}: must be true or false")
    _check_sources(task, where)


def _check_labels(task: DictConfig | Mapping, where: str, labels: int) -> None:
    names, bounds, threshold = task.get("label_names"), task.get("label_range"), task.get("lmbff_threshold")
    if labels == 1:
        if names is not None:
            raise UserError(f"{where}.label_names={_show(names)}: a regression task (num_labels: 1) has no classes; "
                            f"set label_names: null")
        if bounds is not None and not (isinstance(bounds, (list, ListConfig)) and len(bounds) == 2 and
                                       all(_is_number(b) for b in bounds) and bounds[0] < bounds[1]):
            raise UserError(f"{where}.label_range={_show(bounds)}: must be [LOW, HIGH], the valid scores")
        if threshold is not None and not _is_number(threshold):
            raise UserError(f"{where}.lmbff_threshold={_show(threshold)}: must be a score (LM-BFF's split classes "
                            f"the scores below it apart)")
        return
    for key, value in (("label_range", bounds), ("lmbff_threshold", threshold)):
        if value is not None:
            raise UserError(f"{where}.{key}={_show(value)}: only a regression task (num_labels: 1) has it")
    if names is not None:
        if not (_distinct_list(names) and all(isinstance(n, (str, bool, int)) and n != "" for n in names)):
            raise UserError(f"{where}.label_names={_show(names)}: must be a list of distinct class names, or null")
        if len(names) != labels:
            raise UserError(f"{where}.label_names={_show(names)}: {len(names)} names for num_labels={labels}")


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _check_metrics(task: DictConfig | Mapping, where: str, labels: int) -> None:
    metrics = task.metrics
    if not (_distinct_list(metrics) and len(metrics) > 0):
        raise UserError(f"{where}.metrics={_show(metrics)}: must be a list of distinct metrics from {', '.join(METRICS)}")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise UserError(f"{where}.metrics={_show(metrics)}: {unknown[0]} is not a metric peltbench computes; choose "
                        f"from {', '.join(METRICS)}")
    if labels == 1:
        unfit = [m for m in metrics if m not in REGRESSION_METRICS]
        if unfit:
            raise UserError(f"{where}.metrics={_show(metrics)}: {unfit[0]} is not fit for a regression task "
                            f"(num_labels: 1); its metrics: {', '.join(REGRESSION_METRICS)}")
    else:
        unfit = [m for m in metrics if m in REGRESSION_METRICS]
        if unfit:
            raise UserError(f"{where}.metrics={_show(metrics)}: {unfit[0]} correlates scores, for a regression task "
                            f"(num_labels: 1); a classification task's: "
                            f"{', '.join(m for m in METRICS if m not in REGRESSION_METRICS)}")
        if "f1" in metrics and labels != 2:
            raise UserError(f"{where}.metrics={_show(metrics)}: f1 is the F1 of class 1 of two; with {labels} classes "
                            f"use f1_macro")
    if task.main_metric not in metrics:
        raise UserError(f"{where}.main_metric={_show(task.main_metric)}: must be one of its metrics "
                        f"({_show(metrics)})")


def _check_sources(task: DictConfig | Mapping, where: str) -> None:
    dataset, files = task.get("dataset"), task.get("files")
    if dataset is None and files is None:
        raise UserError(f"{where}: where are its rows? give dataset: (a datasets dataset) or files: (local files)")
    if dataset is not None:
        if not isinstance(dataset, (DictConfig, Mapping)):
            raise UserError(f"{where}.dataset={_show(dataset)}: must be a mapping of {', '.join(DATASET_KEYS)}")
        unknown = sorted(set(dataset.keys()) - set(DATASET_KEYS))
        if unknown:
            raise UserError(f"{where}.dataset.{unknown[0]}: not a setting of a dataset; it has {', '.join(DATASET_KEYS)}")
        for key in ("path", "test"):
            if not _text(dataset.get(key)):
                raise UserError(f"{where}.dataset.{key}={_show(dataset.get(key))}: must be "
                                f"{'a datasets name or path' if key == 'path' else 'the name of the reported split'}")
        for key in ("name", "train"):
            if dataset.get(key) is not None and not _text(dataset.get(key)):
                raise UserError(f"{where}.dataset.{key}={_show(dataset.get(key))}: must be a name")
    if files is None:
        return
    layouts = files_layouts(files) if isinstance(files, (DictConfig, ListConfig, Mapping, list)) else None
    if not layouts or not all(isinstance(layout, (DictConfig, Mapping)) for layout in layouts):
        raise UserError(f"{where}.files={_show(files)}: must be a mapping of {', '.join(FILES_KEYS)}, or a list of them")
    formats = sorted(set(FORMATS.values()))
    for layout in layouts:
        unknown = sorted(set(layout.keys()) - set(FILES_KEYS))
        if unknown:
            raise UserError(f"{where}.files.{unknown[0]}: not a setting of files; they have {', '.join(FILES_KEYS)}")
        for key in ("train", "test"):
            if not _text(layout.get(key)):
                raise UserError(f"{where}.files.{key}={_show(layout.get(key))}: must be a file (a path, a glob for "
                                f"shards) holding the {'training pool' if key == 'train' else 'reported test set'}")
        if layout.get("format") is not None and layout.format not in formats:
            raise UserError(f"{where}.files.format={_show(layout.format)}: must be one of {', '.join(formats)}")
        if not _bool(layout.get("header", True)):
            raise UserError(f"{where}.files.header={_show(layout.header)}: must be true or false")
        if layout.get("text") is not None and not _columns(layout.text):
            raise UserError(f"{where}.files.text={_show(layout.text)}: must be a list of one or two text columns")
        if layout.get("label") is not None and not _column(layout.label):
            raise UserError(f"{where}.files.label={_show(layout.label)}: must be the label column's name or index")
        text = layout.get("text") or task.text
        if len(text) != len(task.text):
            raise UserError(f"{where}.files.text={_show(text)}: the task has {len(task.text)} text column(s)")


def check_schedule(train: DictConfig) -> None:
    """Training is bounded by epochs (dev after each) or by steps (dev every `eval_every` steps), never both."""
    epochs, steps, every = train.get("epochs"), train.get("max_steps"), train.get("eval_every")
    if (epochs is None) == (steps is None):
        raise UserError(f"train.epochs={_show(epochs)} train.max_steps={_show(steps)}: give exactly one (a protocol in "
                        f"steps sets train.epochs=null)")
    if (steps is None) != (every is None):
        raise UserError(f"train.max_steps={_show(steps)} train.eval_every={_show(every)}: dev evaluation every N steps "
                        f"goes with training for a number of steps; set both or neither")
    if steps is not None and steps % every:
        raise UserError(f"train.max_steps={steps} must be a multiple of train.eval_every={every} (the last evaluation "
                        f"is at the last step)")


def check_protocol(cfg: DictConfig) -> None:
    """The protocol's fields are valid and the run's k fits its split (docs/protocol.md §10)."""
    node = cfg.get("protocol")
    if node is None:  # a config from before protocols (a record's): unipelt
        return
    once(_check_protocol_node, node)  # a sweep's runs share it
    name, k = node.get("name"), cfg.get("k")
    if node.get("k") == "all" and k != "all":
        raise UserError(f"k={k}: protocol={name} trains on the whole train split (k=all)")
    if node.get("k") == "per_class" and k == "all":
        raise UserError(f"k=all: protocol={name} samples K train rows per class; give k=NUMBER (its own: 16)")
    task = cfg.get("task") or {}
    if node.get("k") == "per_class" and task.get("num_labels") == 1 and task.get("lmbff_threshold") is None:
        raise UserError(f"protocol={name} samples K train rows per class, and task {task.get('name')} is a regression "
                        f"task: give task.lmbff_threshold, the score below which rows are one class (LM-BFF's STS-B: 2.5)")
    if node.get("dev") != "train" and cfg.get("dev_size") is not None and cfg.dev_size != run_defaults(str(name)).dev_size:
        raise UserError(f"dev_size={cfg.dev_size}: protocol={name} does not use it ({SELECTION[node.dev]}); drop it")


def _check_protocol_node(node: DictConfig | Mapping) -> None:
    """What check_protocol asks of the `protocol` node alone."""
    for key, allowed in (("k", K_COUNTS), ("dev", DEV_SOURCES), ("statistic", STATISTICS)):
        if node.get(key) not in allowed:
            raise UserError(f"protocol.{key}={_show(node.get(key))}: must be one of {', '.join(allowed)}")
    name = node.get("name")
    if node.dev in ("glue_dev", "glue_dev_halves") and node.k != "all":
        raise UserError(f"protocol.dev={node.dev} selects on GLUE dev, which only full-data protocols (protocol.k=all) do")
    if (node.dev == "per_class") != (node.k == "per_class"):
        raise UserError(f"protocol.dev={node.dev} with protocol.k={node.k}: a dev set of K rows per class goes with "
                        f"K train rows per class")
    if name in _packaged_protocols():  # a packaged protocol's name stands for its settings: a record labelled with it
        own = protocol_settings(str(name))  # must have run them
        differ = [key for key in ("k", "dev", "statistic") if node.get(key) != own[key]]
        if differ:
            raise UserError(f"protocol.name={name} with protocol.{differ[0]}={node.get(differ[0])}: protocol {name} has "
                            f"{differ[0]}={own[differ[0]]}; choose a protocol with protocol=NAME (not protocol.name=NAME)")


def check_logger(logger: DictConfig | None) -> None:
    """Each logger chosen (logger=csv, logger=[csv,tensorboard], or none with logger=[]) exists, has only its own
    settings, and its optional dependency is installed: found now, not after training."""
    if logger is None:
        return
    for name in logger.keys():
        settings = _logger_settings(str(name))
        if settings is None:
            raise UserError(f"logger.{name}: no such logger; choose from {', '.join(options('logger'))}")
        extra = set(logger[name].keys()) - set(settings)
        if extra:
            raise UserError(f"logger.{name}.{sorted(extra)[0]}: not a setting of logger {name}; its settings: "
                            f"{', '.join(settings) or 'none'}")
        module = LOGGER_EXTRAS.get(name)
        if module is not None and find_spec(module) is None:
            raise UserError(f"logger={name} needs the {module} package: pip install 'peltbench[{module}]'")


@lru_cache(maxsize=None)
def _logger_settings(name: str) -> tuple[str, ...] | None:
    """The settings of packaged logger `name` (conf/logger/<name>.yaml), in its order; None for no such logger."""
    packaged = packaged_config(f"logger/{name}.yaml")
    return None if packaged is None or name not in packaged else tuple(packaged[name].keys())


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse keys peltbench does not read, added with `+` (`+train.epoch=3` would otherwise run 50 epochs), and
    keys it needs that were removed with `~`. `method` and `logger` are checked by their own functions."""
    if isinstance(cfg, dict):  # plain data (a sweep's run): checked once per key structure
        once("known keys", _shape(cfg), lambda _: _check_leaves(cfg))
    else:
        _check_leaves(cfg)
    once(_check_task_keys, cfg.task)
    if cfg.get("protocol") is not None:
        once(_check_protocol_keys, cfg.protocol)


def _check_task_keys(task) -> None:
    unknown = sorted(set(task.keys()) - set(TASK_KEYS))
    if unknown:
        raise UserError(f"task.{unknown[0]}: not a setting of task {task.name}; a task file has "
                        f"{', '.join(TASK_KEYS)} (docs/tasks.md)")
    cloze = task.get("cloze")
    unknown = sorted(set(cloze.keys()) - set(CLOZE_KEYS)) if hasattr(cloze, "keys") else []
    if cloze is not None and not hasattr(cloze, "keys"):
        raise UserError(f"task.cloze: must be a mapping of {', '.join(CLOZE_KEYS)} (docs/tasks.md), not {cloze!r}")
    if unknown:
        raise UserError(f"task.cloze.{unknown[0]}: not a setting of task {task.name}'s prompt; it has "
                        f"{', '.join(CLOZE_KEYS)} (docs/tasks.md)")


def _check_protocol_keys(protocol) -> None:
    settings = _protocol_keys()
    unknown = sorted(set(protocol.keys()) - settings)
    if unknown:
        raise UserError(f"protocol.{unknown[0]}: not a protocol setting; it has {', '.join(sorted(settings))}")


# checked by their own functions, or Hydra's
SKIPPED_NODES = ("hydra", "method", "task", "logger", "protocol", "objective")


def _shape(node: dict, skip: tuple[str, ...] = SKIPPED_NODES) -> tuple:
    """The key structure of plain data: its keys, and that of each dict in it (no values), outside `skip`."""
    keys, children = [], []
    for key, child in node.items():
        if key not in skip:
            keys.append(key)
            if isinstance(child, dict):
                children.append((key, once(_child_shape, child)))
    return tuple(keys), tuple(children)


def _child_shape(node: dict) -> tuple:
    return _shape(node, ())


def _check_leaves(cfg: DictConfig | Mapping) -> None:
    """No key peltbench does not read, none it needs removed (check_known_keys)."""
    packaged = packaged_config("config.yaml")
    defaults = _default_leaves()
    allowed = defaults | set(SETTINGS)
    present = set(_leaves(cfg, skip=SKIPPED_NODES))
    unknown = sorted(present - allowed)
    if unknown:
        parent = unknown[0].rpartition(".")[0]
        siblings = sorted(key.rpartition(".")[2] for key in allowed if key.rpartition(".")[0] == parent)
        hint = f"; {parent} has {', '.join(siblings)}" if parent and siblings else ""
        raise UserError(f"{unknown[0]}: not a peltbench setting{hint} (peltbench --help lists them all)")
    removed = sorted(defaults - present)
    if removed:
        raise UserError(f"{removed[0]}: missing (peltbench needs it; its default is {_show(_select(packaged, removed[0]))})")


@lru_cache(maxsize=None)
def _default_leaves() -> frozenset[str]:
    """The keys conf/config.yaml sets (read once: a sweep checks every run)."""
    return frozenset(_leaves(packaged_config("config.yaml"), skip=("hydra",)))


@lru_cache(maxsize=None)
def _protocol_keys() -> frozenset[str]:
    """The settings a `protocol` node may have, read once."""
    return frozenset(packaged_config("protocol/unipelt.yaml").protocol.keys()) | {"head"}


@lru_cache(maxsize=None)
def _packaged_protocols() -> frozenset[str]:
    """The packaged protocols' names (conf/protocol/), listed once."""
    return frozenset(options("protocol"))


def _leaves(node: DictConfig | Mapping, prefix: str = "", skip: tuple[str, ...] = ()) -> Iterator[str]:
    """Dotted keys of every value that is not itself a mapping, e.g. `train.epochs` (lists are values). `node`: a
    config, or the same as plain data (plain.Plain: peltbench.missing's runs of a sweep)."""
    plain = isinstance(node, dict)  # dict first: Mapping's check is slow (a sweep checks 100,000 runs)
    for key in node.keys():
        if key in skip or key == "defaults":
            continue
        child = node[key] if plain else node._get_node(key)
        if isinstance(child, dict) or (isinstance(child, DictConfig) and not child._is_none()
                                       or not isinstance(child, (str, int, float, list)) and isinstance(child, Mapping)):
            yield from _leaves(child, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _at(cfg: dict, path: tuple[str, ...]):
    """The value at `path` of plain data (plain.Plain), _ABSENT where there is none."""
    node = cfg
    for part in path:
        if not isinstance(node, dict):
            if not isinstance(node, Mapping):
                return _ABSENT
        if part not in node:
            return _ABSENT
        node = node[part]
    return node


def _select(cfg: DictConfig | Mapping, key: str):
    if isinstance(cfg, DictConfig):
        return OmegaConf.select(cfg, key, default=_ABSENT)
    node = cfg  # plain data (plain.Plain), resolved: the same walk
    for part in key.split("."):
        if not (isinstance(node, dict) or isinstance(node, Mapping)) or part not in node:  # dict first: Mapping is slow
            return _ABSENT
        node = node[part]
    return node


def _distinct_list(value) -> bool:
    return isinstance(value, (list, ListConfig)) and len(set(map(str, value))) == len(value)


def _show(value) -> str:
    """A value as the user typed it: [query,value], not ListConfig's repr."""
    if isinstance(value, (list, ListConfig)):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, DictConfig):
        return str(OmegaConf.to_container(value))
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)
