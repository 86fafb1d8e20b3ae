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
from .component import Rule, Setting
from .packaged import options, packaged_config
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
    # Settings a null leaves to the task file (the cloze objective's prompt: the task's `cloze:` block): the run's
    # identity holds the task's value, its folder only a value given for the objective itself
    from_task: str | None = None
    label: str = ""  # its name in tables and captions


def _optional(valid: Callable[[object], bool], must: str) -> Rule:
    return Rule(lambda value: value is None or valid(value), must)


_LIMIT = _optional(lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                   "must be a positive number of tokens, or null (no limit)")
OBJECTIVES: dict[str, Objective] = {
    "classifier": Objective(label="classifier"),
    # LM-BFF's prompt-based fine-tuning (peltbench/cloze.py, templates.py; docs/protocol.md §12)
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
        # demonstrations (LM-BFF's prompt-demo; peltbench/demonstrations.py, docs/protocol.md §12, Demonstrations)
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
    }, before={"demonstrations": False, "demo_filter": None, "demo_filter_rate": 0.5}, from_task="cloze",
        label="cloze"),
}
# What a config without an `objective` node ran (every record made before objectives existed): the default objective
# at its `before` values. An identity without an `objective` part is this.
LEGACY = {"name": DEFAULT, **OBJECTIVES[DEFAULT].before}


def objective_name(config: Mapping | DictConfig | None) -> str:
    """The objective a config (or a record's `config`) ran: `classifier` when it names none (records from before)."""
    node = (config or {}).get("objective") if isinstance(config, (dict, Mapping, DictConfig)) else None
    name = node.get("name") if isinstance(node, (dict, Mapping, DictConfig)) else None
    return str(name) if name else DEFAULT


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
    """A setting's value as a folder name and a table label hold it: itself where it is a plain word or number, else
    (a template, label words: stars, commas, braces that a label `k=v,k=v` cannot carry) `sha-` and 8 hex digits of its
    sha256; the record's config holds it whole."""
    if isinstance(value, (bool, int, float)) or value is None:
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


def label(name: str) -> str:
    """The objective's name in tables and captions."""
    objective = OBJECTIVES.get(name)
    return objective.label if objective is not None and objective.label else name


__all__ = ["DEFAULT", "LEGACY", "OBJECTIVES", "Objective", "check_objective", "declared", "departures", "group_key", "identity",
           "label", "objective_name", "resolved"]
