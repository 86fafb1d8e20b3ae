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

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from omegaconf import DictConfig, OmegaConf

from . import UserError
from .component import Setting, choice
from .packaged import options, packaged_config
from .passes import once
from .plain import once_per_node

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


def head_words(model_type: str) -> str:
    """How the architecture's own head pools, in words (docs, refusals)."""
    return {"bert": "BERT's pretrained pooler", "modernbert": "the first token or the mean, as config.json's "
            "classifier_pooling says"}.get(model_type, "the first token")


OBJECTIVES: dict[str, Objective] = {
    "classifier": Objective(
        settings={"pooling": Setting(choice(*POOLINGS, must=f"must be one of {', '.join(POOLINGS)}"),
                                     "what the head reads (docs/protocol.md §12)")},
        before={"pooling": "head"}, resolve=_classifier_pooling, misfit=_pooling_misfit),
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
    once_per_node(check_objective_node, node, check_objective_node)  # a sweep's runs share it


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
    settings = once_per_node(resolved, node, _plain)
    objective = OBJECTIVES.get(str(settings.get("name")))
    if objective is None or objective.resolve is None:
        return dict(settings)
    model = cfg.get("model") or {}
    return objective.resolve(dict(settings), str(model.get("name", "")), strict)


def identity(cfg) -> dict | None:
    """What of the objective enters a run's identity (record.semantic_config): its resolved node, less each setting
    at its `before` value; None where that leaves the default objective alone (and for a config without a node), so
    every record made before objectives keeps its hash."""
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
    node = identity(cfg)
    if node is None:
        return []
    name = str(node["name"])
    objective, defaults = OBJECTIVES.get(name), file_defaults(name)
    before = objective.before if objective is not None else {}
    parts: list[tuple[str, object]] = [] if name == DEFAULT else [("objective", name)]
    for key, value in node.items():
        if key != "name" and value != before.get(key, defaults.get(key)):
            parts.append((f"objective.{key}", value))
    return parts


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
    """How a sentence-transformers checkpoint pools (its modules.json's Pooling module's config.json): `first`,
    `mean` or `max`; None for a checkpoint that is not one (no modules.json, or none with a Pooling module). Read from
    a local directory, or for a Hub id from the Hugging Face cache; where the cache cannot tell, `strict` (a run, before
    its folder is chosen) asks the Hub, and where it cannot be asked either, the run takes the architecture's head and
    the log says so; not `strict` (a plan, peltbench-missing) it takes the head without asking. A mode the classifier
    does not pool as sentence-transformers does (mean_sqrt_len, weighted mean, last token, several at once) is a
    UserError in one line. Inside one_pass() (a sweep's check, the tables) asked once per model."""
    return once("sentence_pooling", (name, strict), lambda key: _sentence_pooling(*key))


def _sentence_pooling(name: str, strict: bool) -> str | None:
    if not name:
        return None
    found = _sentence_file(name, SENTENCE_MODULES, strict)
    if found is None:
        return None
    modules = _read_json(found, name)
    paths = [str(module.get("path") or "") for module in modules if isinstance(module, dict)
             and str(module.get("type", "")).endswith("Pooling")] if isinstance(modules, list) else []
    if not paths:
        return None
    where = f"{paths[0]}/config.json" if paths[0] else "config.json"
    config = _sentence_file(name, where, strict)
    if config is None:
        return None
    return _mode(_read_json(config, name), name, where)


def _mode(config, name: str, where: str) -> str:
    if not isinstance(config, dict):
        raise UserError(f"model.name={name}: its {where} is not a sentence-transformers Pooling config")
    if isinstance(config.get("pooling_mode"), str):
        modes = [config["pooling_mode"]]
    else:
        modes = [key.removeprefix("pooling_mode_") for key, value in config.items()
                 if key.startswith("pooling_mode_") and value is True]
    if len(modes) == 1 and modes[0] in SENTENCE_POOLINGS:
        return SENTENCE_POOLINGS[modes[0]]
    said = " + ".join(modes) or "no pooling mode"
    raise UserError(f"model.name={name}: its sentence-transformers pooling ({where}: {said}) is not one the classifier "
                    f"pools as it does (cls_token, mean_tokens or max_tokens alone); set objective.pooling to one of "
                    f"{', '.join(POOLINGS[1:])}")


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


def _read_json(path: str, name: str):
    import os

    try:
        found = os.stat(path)
        return _json_file(path, found.st_mtime_ns, found.st_size)
    except (OSError, ValueError) as error:
        raise UserError(f"model.name={name}: cannot read {path} ({error})") from None


@lru_cache(maxsize=64)
def _json_file(path: str, mtime_ns: int, size: int):
    """The JSON file at `path` as it was at (`mtime_ns`, `size`): read again only when it changed. Never change what
    it returns."""
    import json

    with open(path) as handle:
        return json.load(handle)


__all__ = ["DEFAULT", "LEGACY", "OBJECTIVES", "Objective", "check_objective", "declared", "departures", "group_key",
           "identity", "model_misfit", "resolved", "sentence_pooling"]
