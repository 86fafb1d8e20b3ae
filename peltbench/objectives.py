"""Training objectives (conf/objective/, docs/protocol.md §12): what the model is trained to output from a row, a
config group beside `method`, `task` and `protocol` (`objective=NAME`, its settings `objective.KEY=VALUE`).

An objective is its file (conf/objective/<name>.yaml: `name` and its settings' defaults), its declaration here
(`OBJECTIVES`: each setting's rule and help, which settings a fused group's members must share, the values that
compute what peltbench computed before the setting existed, and how a value the checkpoint decides is read from it)
and its code in the model (the classifier: methods/base.py's head). This module reads the `objective` node for the
config check, the record (identity and folder), fused groups and the tables, one way for every objective: its
settings enter a run's identity and folder as the node says them, so a new objective is a file, a declaration and
its code. It imports only omegaconf and the packaged files (the config is checked before torch).

The default objective, at the settings that compute what peltbench computed before objectives existed, adds nothing
to a run's identity or folder: every record made before keeps its hash and folder, and a record's config without an
`objective` node ran that (`LEGACY`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from omegaconf import DictConfig, OmegaConf

from . import UserError
from .component import Rule, Setting, choice
from .packaged import options, packaged_config
from .passes import once

DEFAULT = "classifier"  # a new head on one pooled vector of the encoder's output (each *ForSequenceClassification's)


@dataclass(frozen=True)
class Objective:
    """What peltbench knows about an objective besides its file: read before torch."""

    settings: dict[str, Setting] = field(default_factory=dict)  # objective.KEY: its rule and help line
    # The value of a setting that computes what peltbench computed before the setting existed: a node at it is the
    # run every record from before was (left out of the identity; a folder names a value only where it departs from it)
    before: dict[str, object] = field(default_factory=dict)
    shared: tuple[str, ...] = ()  # settings a fused group's members share (those one forward pass cannot serve apart)
    # A setting's value the checkpoint decides (the classifier's `pooling: auto`): resolve(settings, model name,
    # strict) -> the settings with it decided. Not strict: from the checkpoint's folder or the Hugging Face cache only,
    # the value `before` where they do not tell (a sweep's plan, peltbench-missing); strict (the run itself, before
    # its folder is chosen): the Hub asked where it can be, else refused in one line.
    resolve: Callable[[dict, str, bool], dict] | None = None
    # Settings a null leaves to the task file (the cloze objective's prompt: the task's `cloze:` block): the run's
    # identity holds the task's value, its folder only a value given for the objective itself
    from_task: str | None = None
    # Why a run of these (resolved) settings cannot use a model of this config.json (a dict), or None: checked before
    # torch where config.json can be read then (config.check_model_fit), else once the run has loaded it
    misfit: Callable[[dict, dict], str | None] | None = None


# ---------------------------------------------------------------- the classifier's pooling (issue 57, item 6)

# What the classifier's head reads (objective.pooling). `auto`: the checkpoint's own where it says (a sentence-
# transformers folder's Pooling module), else `head`; `head`: the architecture's own *ForSequenceClassification pooling
# (architectures.head_pooling: BERT's pretrained pooler, RoBERTa's / ELECTRA's / DeBERTa's first token, ModernBERT's
# config.classifier_pooling), what peltbench did before the setting existed; the others whatever the architecture.
POOLINGS = ("auto", "head", "pooler", "first", "mean", "max")
# sentence-transformers' Pooling config (its `pooling_mode_*` flags, or `pooling_mode` in newer versions): the modes
# the classifier pools as that library does, by their peltbench names.
SENTENCE_POOLINGS = {"cls_token": "first", "mean_tokens": "mean", "max_tokens": "max",
                     "cls": "first", "mean": "mean", "max": "max"}
SENTENCE_MODULES = "modules.json"  # a sentence-transformers folder's list of its modules (Transformer, Pooling, ...)


def _classifier_pooling(settings: dict, model: str, strict: bool) -> dict:
    """`pooling: auto` decided from the checkpoint (sentence_pooling), `head` where it says nothing."""
    if settings.get("pooling") != "auto":
        return settings
    return {**settings, "pooling": sentence_pooling(model, strict) or "head"}


def _pooling_misfit(settings: dict, model_config: dict) -> str | None:
    from .architectures import ARCHITECTURES, NAMES

    arch = ARCHITECTURES.get(model_config.get("model_type"))
    if settings.get("pooling") != "pooler" or arch is None or arch.head.pool == "pooler":
        return None
    return (f"objective.pooling=pooler reads BERT's pretrained pooler, and {NAMES[arch.model_type]}'s "
            f"*ForSequenceClassification has none; choose head (its own: {head_words(arch.model_type)}), first, "
            f"mean or max")


def classifier_pooling(node: dict | None) -> str:
    """What a classifier run's head reads (its `pooling`, decided: head, pooler, first, mean or max; `head` for a config
    from before objectives): what the runner builds its model with (methods.build_pelt_model's `poolings`)."""
    node = node or LEGACY
    if node.get("name") != "classifier":
        raise ValueError(f"objective {node.get('name')}: it has no classifier pooling (its own head: a fused group "
                         f"holds one objective)")
    kind = str(node.get("pooling", "head"))
    if kind == "auto":  # decided from the checkpoint before the model is built (resolved)
        raise ValueError("objective.pooling=auto reached the model undecided")
    return kind


def head_words(model_type: str) -> str:
    """How the architecture's own head pools, in words (docs, refusals)."""
    return {"bert": "BERT's pretrained pooler", "modernbert": "the first token or the mean, as config.json's "
            "classifier_pooling says"}.get(model_type, "the first token")


def _optional(valid: Callable[[object], bool], must: str) -> Rule:
    return Rule(lambda value: value is None or valid(value), must)


_LIMIT = _optional(lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                   "must be a positive number of tokens, or null (no limit)")
OBJECTIVES: dict[str, Objective] = {
    "classifier": Objective(
        settings={"pooling": Setting(choice(*POOLINGS, must=f"must be one of {', '.join(POOLINGS)}"),
                                     "what the head reads (docs/protocol.md §12.1)")},
        before={"pooling": "head"}, resolve=_classifier_pooling, misfit=_pooling_misfit),
    # LM-BFF's prompt-based fine-tuning (peltbench/cloze.py, templates.py; docs/protocol.md §12.2)
    "cloze": Objective(settings={
        "template": Setting(_optional(lambda v: isinstance(v, str) and bool(v), "must be a template in LM-BFF's "
                                      "language, e.g. '*cls**sent_0*_It_was*mask*.*sep+*', or null (the task's)"),
                            "LM-BFF's template, one *mask* (null: the task file's cloze.template)"),
        "label_words": Setting(_optional(lambda v: isinstance(v, (dict, Mapping, DictConfig)) and len(v) > 0,
                                         "must map each class to a word, e.g. {0: terrible, 1: great}, or null (the "
                                         "task's)"),
                               "one word per class, keyed by its name or id (null: the task file's cloze.label_words)"),
        "first_sent_limit": Setting(_LIMIT, "tokens kept of sentence 0 (LM-BFF's --first_sent_limit; null: the "
                                            "task's)"),
        "other_sent_limit": Setting(_LIMIT, "tokens kept of every other sentence (LM-BFF's --other_sent_limit)"),
        "truncate_head": Setting(Rule(lambda v: isinstance(v, bool), "must be true or false"),
                                 "cut a row that is too long at its head, not its tail (LM-BFF's --truncate_head)"),
        # demonstrations (LM-BFF's prompt-demo; peltbench/demonstrations.py, docs/protocol.md §12.3)
        "demonstrations": Setting(Rule(lambda v: isinstance(v, bool), "must be true or false"),
                                  "append one training row of each class to every input (LM-BFF's prompt-demo)"),
        "num_sample": Setting(_optional(lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                                        "must be a positive number of demonstration sets, or null (the task's)"),
                              "demonstration sets per evaluation row, outputs averaged (LM-BFF's --num_sample; null: "
                              "the task file's cloze.num_sample, else 16)"),
        "double_demo": Setting(_optional(lambda v: isinstance(v, bool), "must be true, false or null (the task's)"),
                               "inputs with demonstrations get twice train.max_length (LM-BFF's --double_demo; null: "
                               "the task file's, else false)"),
        "demo_filter": Setting(_optional(lambda v: isinstance(v, str) and bool(v), "must be the folder of a sentence "
                                         "encoder (e.g. all-MiniLM-L6-v2's), or null (no filter)"),
                               "demonstrations only among the training rows most similar to the row, by this sentence "
                               "encoder (LM-BFF's --demo_filter)"),
        "demo_filter_rate": Setting(Rule(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                                         and 0 < v <= 1, "must be a share in (0, 1]"),
                                    "the share of each class's training rows the filter keeps (LM-BFF's "
                                    "--demo_filter_rate)"),
    }, before={"demonstrations": False, "demo_filter": None, "demo_filter_rate": 0.5}, from_task="cloze"),
}
# What a config without an `objective` node ran (every record made before objectives existed): the default objective
# at its `before` values. An identity without an `objective` part is this.
LEGACY = {"name": DEFAULT, **OBJECTIVES[DEFAULT].before}


def declared(name: str) -> Objective:
    """The declaration of objective `name` (a UserError naming the objectives for an unknown one)."""
    found = OBJECTIVES.get(name)
    if found is None or name not in _packaged():
        raise UserError(f"objective={name}: no such objective; choose from {', '.join(sorted(_packaged()))}")
    return found


@lru_cache(maxsize=None)
def _packaged() -> frozenset[str]:
    """The packaged objectives' names (conf/objective/), listed once."""
    return frozenset(options("objective"))


@lru_cache(maxsize=None)
def file_defaults(name: str) -> dict:
    """conf/objective/<name>.yaml as plain data (read once: never change what it returns); {} for no such file."""
    packaged = packaged_config(f"objective/{name}.yaml")
    return {} if packaged is None else OmegaConf.to_container(packaged, resolve=True)


def _plain(node) -> dict:
    """A fresh plain copy of the objective node."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return {key: (dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value)
            for key, value in node.items()}


# ---------------------------------------------------------------- checks (before torch)

def check_objective(cfg) -> None:
    """The objective is a packaged one, with exactly its declared settings, each valid: one line naming the key."""
    node = cfg.get("objective")
    if node is None:  # a config from before objectives (a record's): the classifier
        return
    once(check_objective_node, node)  # a sweep's runs share it


def check_objective_node(node) -> None:
    name = node.get("name")
    if not isinstance(name, str) or not name:
        raise UserError(f"objective.name={name}: choose an objective with objective=NAME "
                        f"({', '.join(sorted(_packaged()))})")
    objective = declared(name)
    allowed = {"name", *objective.settings}
    unknown = sorted(set(node.keys()) - allowed)
    if unknown:
        have = ", ".join(sorted(allowed))
        raise UserError(f"objective.{unknown[0]}: not a setting of objective {name}; it has {have}")
    missing = sorted(key for key in objective.settings if key not in node)
    if missing:
        raise UserError(f"objective.{missing[0]}: missing; objective {name} needs it (its file: "
                        f"conf/objective/{name}.yaml)")
    for key, setting in objective.settings.items():
        if not setting.rule.valid(node[key]):
            raise UserError(f"objective.{key}={_show(node[key])}: {setting.rule.must}")


def _show(value) -> str:
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


# ---------------------------------------------------------------- identity, folder, fused groups

def resolved(cfg, strict: bool = False) -> dict | None:
    """The run's objective node as plain data, each value the checkpoint decides decided (`Objective.resolve`);
    None for a config without one (a record's from before objectives)."""
    node = cfg.get("objective")
    if node is None:
        return None
    settings = once(_plain, node)
    objective = OBJECTIVES.get(str(settings.get("name")))
    if objective is None or objective.resolve is None:
        return dict(settings)
    model = cfg.get("model") or {}
    return objective.resolve(dict(settings), str(model.get("name", "")), strict)


def identity(cfg) -> dict | None:
    """What of the objective enters a run's identity (record.semantic_config): its resolved node, less each setting
    at its `before` value, a null the objective leaves to the task (`from_task`) as the task file has it; None where
    that leaves the default objective alone (and for a config without a node), so every record made before
    objectives keeps its hash."""
    kept = _settings(cfg)
    if kept is None:
        return None
    objective = OBJECTIVES.get(str(kept.get("name")))
    if objective is not None and objective.from_task:
        given = (cfg.get("task") or {}).get(objective.from_task) or {}
        kept = {key: (given.get(key) if value is None else value) for key, value in kept.items()}
        kept = {key: {str(k): v for k, v in _plain(value).items()} if isinstance(value, (dict, Mapping, DictConfig))
                else value for key, value in kept.items()}  # label words: keyed as text (YAML's 0 and '0' alike)
    return None if kept == {"name": DEFAULT} else kept


def _settings(cfg) -> dict | None:
    """The resolved node less each setting at its `before` value (None: no node, or the default objective alone)."""
    node = resolved(cfg)
    if node is None:
        return None
    objective = OBJECTIVES.get(str(node.get("name")))
    before = objective.before if objective is not None else {}
    kept = {key: value for key, value in node.items() if not (key in before and before[key] == value)}
    return None if kept == {"name": DEFAULT} else kept


def departures(cfg) -> list[tuple[str, object]]:
    """(key, value) the run's folder names for its objective (record.variant_name) and the tables' label keeps apart
    (tables.comparability): `objective=NAME` for another objective than the default, then `objective.KEY=VALUE` for
    each setting whose resolved value departs from its `before` value, else from its file's default."""
    node = _settings(cfg)  # a value the objective leaves to the task file is the task's, not a departure
    if node is None:
        return []
    name = str(node["name"])
    objective, defaults = OBJECTIVES.get(name), file_defaults(name)
    before = objective.before if objective is not None else {}
    parts: list[tuple[str, object]] = [] if name == DEFAULT else [("objective", name)]
    for key, value in node.items():
        if key != "name" and value != before.get(key, defaults.get(key)):
            parts.append((f"objective.{key}", _shown(value)))
    return parts


def _shown(value):
    """A setting's value as a folder name and a table label hold it: a truth value or null as Hydra's override takes it
    (`true`, `false`, `null`: `objective.demonstrations=true`, as the tables' label spells it), itself where it is a
    plain word or number, else (a template, label words: stars, commas, braces that a label `k=v,k=v` cannot carry)
    `sha-` and 8 hex digits of its sha256; the record's config holds it whole."""
    if isinstance(value, bool) or value is None:
        return _show(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and re.fullmatch(r"[\w.\-]+", value):
        return value
    plain = _plain(value) if isinstance(value, (dict, Mapping, DictConfig)) else value
    text = json.dumps({str(k): v for k, v in plain.items()} if isinstance(plain, dict) else plain, sort_keys=True)
    return "sha-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def group_key(cfg) -> tuple:
    """What members of one fused group share of their objective: its name (each objective computes its own outputs
    from the encoder's) and the settings it declares `shared`."""
    node = resolved(cfg) or {"name": DEFAULT}
    objective = OBJECTIVES.get(str(node["name"]))
    shared = objective.shared if objective is not None else ()
    return (str(node["name"]), *(repr(node.get(key)) for key in shared))


def model_misfit(cfg, model_config: dict | None) -> str | None:
    """Why the run's objective cannot use a model of `model_config` (its config.json), or None."""
    node = resolved(cfg)
    objective = OBJECTIVES.get(str(node.get("name"))) if node is not None else None
    if objective is None or objective.misfit is None or model_config is None:
        return None
    return objective.misfit(node, model_config)


# ---------------------------------------------------------------- what a checkpoint says of its pooling

def sentence_pooling(name: str, strict: bool = False) -> str | None:
    """How a sentence-transformers checkpoint pools (sentence_modes), by the classifier's names: `first`, `mean` or
    `max`; None for a checkpoint that is not one. Where the cache cannot tell, `strict` (a run, before its folder is
    chosen) asks the Hub, and where it cannot be asked either, the run takes the architecture's head and the log says
    so; not `strict` (a plan, peltbench-missing) it takes the head without asking. A mode the classifier does not pool
    as sentence-transformers does (mean_sqrt_len, weighted mean, last token, several at once) is a UserError in one
    line. Inside one_pass() (a sweep's check, the tables) asked once per model."""
    return once(_sentence_pooling, (name, strict))


def _sentence_pooling(asked: tuple[str, bool]) -> str | None:
    name, strict = asked
    found = sentence_modes(name, strict)
    if found is None:
        return None
    modes, where = found
    kind = pooling_kind(modes)
    if kind is None:
        said = " + ".join(modes) or "no pooling mode"
        raise UserError(f"model.name={name}: its sentence-transformers pooling ({where}: {said}) is not one the "
                        f"classifier pools as it does (cls_token, mean_tokens or max_tokens alone); set "
                        f"objective.pooling to one of {', '.join(POOLINGS[1:])}")
    return kind


def pooling_kind(modes: list[str]) -> str | None:
    """The pooling (first, mean, max) of sentence-transformers' modes where peltbench pools as that library does
    (one mode: cls_token, mean_tokens or max_tokens), else None."""
    return SENTENCE_POOLINGS.get(modes[0]) if len(modes) == 1 else None


def sentence_modes(name: str, strict: bool = False, key: str = "model.name") -> tuple[list[str], str] | None:
    """The pooling modes a sentence-transformers checkpoint names (its modules.json's Pooling module's config.json: its
    `pooling_mode_*` flags that are true, or newer versions' `pooling_mode`) and that file's path in the checkpoint;
    None for a checkpoint that is not one (no modules.json, or none with a Pooling module: sentence-transformers
    itself would pool it by the mean). Read from a local directory, or for a Hub id from the Hugging Face cache
    (`strict`: asking the Hub where the cache cannot tell). The one reader of a checkpoint's pooling: the classifier's
    `pooling: auto` (sentence_pooling) and the demonstration filter's encoder (sentence_encoder.sentence_pooling).
    `key`: the setting that named the checkpoint, for a refusal of an unreadable file."""
    if not name:
        return None
    found = _sentence_file(name, SENTENCE_MODULES, strict)
    if found is None:
        return None
    modules = _read_json(found, f"{key}={name}")
    paths = [str(module.get("path") or "") for module in modules if isinstance(module, dict)
             and str(module.get("type", "")).endswith("Pooling")] if isinstance(modules, list) else []
    if not paths:
        return None
    where = f"{paths[0]}/config.json" if paths[0] else "config.json"
    config = _sentence_file(name, where, strict)
    if config is None:
        return None
    config = _read_json(config, f"{key}={name}")
    if not isinstance(config, dict):
        raise UserError(f"{key}={name}: its {where} is not a sentence-transformers Pooling config")
    if isinstance(config.get("pooling_mode"), str):
        return [config["pooling_mode"]], where
    return [key.removeprefix("pooling_mode_") for key, value in config.items()
            if key.startswith("pooling_mode_") and value is True], where


def _sentence_file(name: str, file: str, strict: bool) -> str | None:
    """The path of `file` of checkpoint `name`: in its local directory, or the Hugging Face cache (strict: fetched from
    the Hub where the cache cannot tell); None where it has none."""
    import os

    from .model import is_local

    if is_local(name):
        path = os.path.join(os.path.expanduser(name), file)
        return path if os.path.isfile(path) else None
    return _hub_file(name, file, strict)


def _hub_file(name: str, file: str, strict: bool) -> str | None:
    import logging

    try:
        from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import EntryNotFoundError

        cached = try_to_load_from_cache(name, file)
    except Exception:  # an id the cache cannot hold, an unreadable cache: the model's load says what is wrong
        return None
    if isinstance(cached, str):
        return cached
    if cached is not None or not strict:  # the cache knows there is none; or a plan, which asks no Hub
        return None
    from .hub import use_hub

    use_hub()
    if constants.HF_HUB_OFFLINE:
        logging.getLogger("peltbench").warning(
            "model.name=%s: objective.pooling=auto cannot tell whether it is a sentence-transformers checkpoint (its "
            "%s is not in the Hugging Face cache, and the Hub is offline): it reads the architecture's own head; "
            "set objective.pooling to choose", name, file)
        return None
    try:
        return hf_hub_download(name, file)
    except EntryNotFoundError:  # the cache now knows it has none
        return None
    except Exception:  # the model's own load says what is wrong (no such repository, a gated one, ...)
        return None


def _read_json(path: str, given: str):
    import os

    try:
        found = os.stat(path)
        return _json_file(path, found.st_mtime_ns, found.st_size)
    except (OSError, ValueError) as error:
        raise UserError(f"{given}: cannot read {path} ({error})") from None


@lru_cache(maxsize=64)
def _json_file(path: str, mtime_ns: int, size: int):
    """The JSON file at `path` as it was at (`mtime_ns`, `size`): read again only when it changed. Never change what
    it returns."""
    with open(path) as handle:
        return json.load(handle)


__all__ = ["DEFAULT", "LEGACY", "OBJECTIVES", "Objective", "check_objective", "classifier_pooling", "declared",
           "departures", "group_key", "identity", "model_misfit", "pooling_kind", "resolved", "sentence_modes",
           "sentence_pooling"]
