"""Result records: where a run's `result.json` lives, what identifies its config, and writing it safely.

The format is documented field by field in docs/record.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import orjson
from omegaconf import DictConfig, ListConfig, OmegaConf

from . import UserError, __version__
from .component import code_identity, code_identity_as, is_builtin
from .files import create, folder_lock, remove_leftovers, temporary_name, write_file
from .model import is_local
from .packaged import method_file, packaged_config, user_config_dirs
from .passes import once, one_pass  # noqa: F401  (one_pass: readers of records import it from here)
from .objectives import LEGACY as LEGACY_OBJECTIVE, departures as objective_departures, identity as objective_identity
from .plain import Plain
from .protocols import (DEFAULT as DEFAULT_PROTOCOL, default_values, identity as protocol_identity, lmbff_chain,
                        method_overrides, protocol_name)
from .tasks import RESULT_KEYS

log = logging.getLogger("peltbench")

SCHEMA = 1
# Top-level settings that change results (besides method and task). Where the results go, where the data
# comes from (Hub or an identical local copy), the device and evaluation batch size do not.
SEMANTIC_KEYS = ("k", "seed", "model_seed", "dev_size", "model.name", "train.epochs", "train.patience",
                 "train.batch_size", "train.max_length", "train.grad_clip")
FOLDER_KEYS = SEMANTIC_KEYS[2:]  # k and seed have folders of their own; the rest join the variant name
PROBE_BYTES = 64 * 1024          # about the size of a large record (k = 1000: 2,000 split indices, 50 epochs)
MIN_FREE_BYTES = 1024 * 1024     # less free space than this on the results disk fails the probe


class RecordWriteError(Exception):
    """The record could not be written (full disk, permissions changed during the run): the run's result is lost."""


# ---------------------------------------------------------------- identity and place

def model_identity(name: str) -> str:
    """One spelling per model: a local directory as its real absolute path (DIR, DIR/, a relative path to it and a
    symlink to it are one model), a Hub id as given. A record written with the absolute real path keeps its hash.
    Inside one_pass() each name is resolved once, as it was when first asked."""
    return once(_model_identity, name)


def _model_identity(name: str) -> str:
    if is_local(name):
        return os.path.realpath(os.path.expanduser(name))
    return name


def data_location(data_dir: str | None) -> str | None:
    """Where the run's GLUE files are, as a real absolute path (null: the Hub): a copy of the run folder finds them
    there whatever directory the run was started from (record field `data_dir`; peltbench.load_run)."""
    return None if data_dir is None else os.path.realpath(os.path.expanduser(str(data_dir)))


# Method settings added after records existed, with the value that reproduces the behaviour from before they
# existed: at that value they are left out of the identity, so earlier records keep their hash.
LATER_METHOD_KEYS = {"gate_pooling": "masked", "lora_freeze_a": False, "prefix_projection": True,
                     "prefix_shift_positions": False, "lora_init": "kaiming"}
# The same for top-level settings (protocols, issue 20): training bounded by steps, dev every N steps.
LATER_KEYS = {"train.max_steps": None, "train.eval_every": None}


def semantic_config(cfg: DictConfig | Mapping, rows: str | None = None) -> dict:
    """Everything that identifies an experiment: the method's settings, the task, and SEMANTIC_KEYS.

    `cfg`: a run's config, or the same as plain data (a record's `config`, a sweep's run as peltbench.missing composes
    it): read the same way (`select`), so the identity is the one OmegaConf would give (a plain config that holds
    interpolations or `???` is read through OmegaConf). A task of the user's own is identified by what decides its
    numbers (task_identity), its rows by `rows` where given (a record's, as it stored them), else as this process
    reads them."""
    cfg = readable(cfg)
    method = container(cfg["method"])
    for key, value in LATER_METHOD_KEYS.items():
        if method.get(key) == value:
            del method[key]
    task = cfg["task"]
    identity = {"method": method, "task": task["name"]}
    main_metric = _packaged_main_metric(task["name"])
    own = task_identity(cfg, rows)
    if own is not None:
        identity.update(own)
    elif main_metric is not None and task.get("main_metric", main_metric) != main_metric:
        identity["task.main_metric"] = task["main_metric"]  # selected on another metric (LM-BFF's STS-B: Pearson)
    if type(cfg) is not Plain and isinstance(cfg, DictConfig):  # Plain first: DictConfig's is an ABC's check (slow)
        for key in SEMANTIC_KEYS:
            identity[key] = select(cfg, key)
    else:  # plain data: each key's path split once (a sweep reads 100,000 configs)
        for key, path in _SEMANTIC_PATHS:
            identity[key] = _walk(cfg, path, None)
    identity["model.name"] = model_identity(str(identity["model.name"]))
    for key, before in LATER_KEYS.items():
        value = select(cfg, key, default=before)
        if value != before:
            identity[key] = value
    code = user_code(method.get("components") or ())
    if code:  # a user's component: which code made the run (a built-in adds nothing: peltbench's version is its code)
        identity["code"] = code
    objective = objective_identity(cfg)  # None for the classifier as peltbench ran it before objectives existed
    if objective is not None:
        identity["objective"] = objective
    protocol = protocol_identity(cfg)  # None at unipelt: records from before protocols keep their hash
    if protocol is not None:
        identity["protocol"] = protocol
        if protocol.get("dev") == "per_class" and lmbff_chain(int(cfg["seed"]), _chained(task)):
            identity["split"] = "lmbff-chained"  # CoLA as LM-BFF released it (protocols.lmbff_chain): records before
            # this key split CoLA from file order for every seed, another split, so they are another run
    return identity


# What of a user's own task enters its runs' identity, besides its rows (`task.rows`): the head (num_labels), what is
# measured and selected on, and how LM-BFF's split samples it. Its columns, label names and files decide its rows,
# which the identity holds as read (data.rows_digest): a changed file is another run, an unchanged one read from
# another format or folder the same run.
TASK_IDENTITY_KEYS = ("num_labels", "metrics", "main_metric", "lmbff_chained", "lmbff_threshold")


def task_identity(cfg: DictConfig | Mapping, rows: str | None = None) -> dict | None:
    """`task.*` parts of the identity of a run of a task that is not a packaged one as shipped (None for those: a
    packaged task's name stands for its data, as GLUE's records always had it): TASK_IDENTITY_KEYS and `task.rows`,
    the digest of its train pool's and test set's rows (`rows`, else read through peltbench.data, once a process)."""
    task = cfg["task"]
    if is_packaged_task(task):
        return None
    identity = {f"task.{key}": container(task.get(key)) for key in TASK_IDENTITY_KEYS}
    if rows is None:
        from .data import data_digest
        from .tasks import TaskSpec

        spec = TaskSpec.from_config(task if isinstance(task, DictConfig) else container(task))
        data_dir = select(cfg, "data.dir")
        rows = data_digest(spec, None if data_dir is None else str(data_dir))
    identity["task.rows"] = rows
    return identity


def is_packaged_task(task: DictConfig | Mapping) -> bool:
    """Whether a task node is a packaged task file's (conf/task/), as this version ships it or as records from before
    task files took their present form hold it (`hub` and `tsv`), in what decides results (tasks.RESULT_KEYS)."""
    return once(_is_packaged_task, task)  # a sweep's runs share their task node


def _is_packaged_task(task: DictConfig | Mapping) -> bool:
    packaged = _packaged_task(str(task.get("name")))
    if packaged is None:
        return False
    if "hub" in task and "tsv" in task:
        return True
    if isinstance(task, dict):  # plain data compares as it is (a sweep's 100,000 runs: no copy of each value)
        return all(task.get(key) == packaged.get(key) for key in RESULT_KEYS)
    return all(container(task.get(key)) == packaged.get(key) for key in RESULT_KEYS)


@lru_cache(maxsize=None)
def _packaged_task(name: str) -> dict | None:
    packaged = packaged_config(f"task/{name}.yaml")
    return None if packaged is None else OmegaConf.to_container(packaged, resolve=True)


def _chained(task) -> bool:
    """Whether LM-BFF's script shuffles the task's train file in place (protocols.lmbff_chain): the task file's
    `lmbff_chained`; in a record from before it, the glue_data file's lack of a header (CoLA's)."""
    if "tsv" in task and "lmbff_chained" not in task:
        return not task["tsv"]["header"]
    return bool(task.get("lmbff_chained", False))


def user_code(components) -> dict[str, str]:
    """{component: its code} for each of a method's components that is a user's (named by its import path), as
    component.code_identity says it: its package's version where it has one and a hash of what the modules that
    importing it runs mean. A change of that code makes another run (docs/record.md, "The identity of a user's
    code"); a record made by the rule before (`source ...`) is read by its rule (read_as_recorded)."""
    return {str(name): code_identity(str(name)) for name in components if not is_builtin(str(name))}


@lru_cache(maxsize=None)
def _packaged_main_metric(task: str):
    """The main metric of the packaged task file `task` (None: no such file). Read once per task."""
    packaged = packaged_config(f"task/{task}.yaml")
    return None if packaged is None else packaged.main_metric


# ---------------------------------------------------------------- a config as plain data

def readable(cfg: DictConfig | Mapping) -> DictConfig | Mapping:
    """`cfg` as the functions here read it: a DictConfig as it is; a plain config as it is, unless one of its strings
    means something to OmegaConf (an interpolation `${...}`, the missing value `???`): then as OmegaConf reads it."""
    if type(cfg) is Plain or isinstance(cfg, (DictConfig, Plain)) or not omegaconf_strings(cfg):
        return cfg
    return OmegaConf.create(container(cfg))


def omegaconf_strings(value) -> bool:
    """Whether plain data holds a string OmegaConf reads as more than text: an interpolation `${...}`, or `???`."""
    try:  # JSON's text of it holds every string: a quick look (a record's config, 10 us) before a walk
        text = json.dumps(value)
    except (TypeError, ValueError):
        return _walk_strings(value)
    return may_hold_omegaconf_strings(text) and _walk_strings(value)


def may_hold_omegaconf_strings(text: str | bytes) -> bool:
    """Whether JSON text (or its UTF-8 bytes, as a record file holds it) may hold a string OmegaConf reads as more than
    text (False: it holds none)."""
    if isinstance(text, bytes):  # one byte looked for first (memchr: a tenth of the time of two bytes' search)
        return (b"$" in text and b"${" in text) or (b"?" in text and b'"???"' in text)
    return "${" in text or '"???"' in text


def _walk_strings(value) -> bool:
    if isinstance(value, str):
        return "${" in value or value == "???"
    if isinstance(value, Mapping):
        return any(_walk_strings(item) for item in value.values())
    if isinstance(value, list):
        return any(_walk_strings(item) for item in value)
    return False


def select(cfg: DictConfig | Mapping, key: str, default=None):
    """OmegaConf.select(cfg, key, default=default), also for a plain (resolved) config: the value at the dotted
    `key`, `default` where there is none."""
    if type(cfg) is not Plain and isinstance(cfg, DictConfig):
        return OmegaConf.select(cfg, key, default=default)
    return _walk(cfg, _KEY_PARTS.get(key) or _split(key), default)


_KEY_PARTS: dict[str, tuple[str, ...]] = {}  # select's keys, split once (a sweep reads ~20 of them in each of its runs)


def _split(key: str) -> tuple[str, ...]:
    parts = tuple(key.split("."))
    if len(_KEY_PARTS) < 4096:
        _KEY_PARTS[key] = parts
    return parts


def _walk(cfg: Mapping, path: tuple[str, ...], default):
    """select on plain data, the key's path split already."""
    node = cfg
    for part in path:
        kind = type(node)  # a Plain or a dict by their type first: isinstance's check of Mapping, an ABC, is slow
        if kind is not Plain and kind is not dict and not isinstance(node, Mapping):
            return default
        node = node.get(part, _MISSING)
        if node is _MISSING:
            return default
    return node


_SEMANTIC_PATHS = tuple((key, tuple(key.split("."))) for key in SEMANTIC_KEYS)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def container(node):
    """A fresh plain copy of a config node: OmegaConf.to_container(node, resolve=True), or of plain data."""
    kind = type(node)
    if kind in _SCALARS:
        return node
    if kind is dict or kind is Plain:
        return {key: value if type(value) in _SCALARS else container(value) for key, value in node.items()}
    if kind is list:
        return [value if type(value) in _SCALARS else container(value) for value in node]
    if isinstance(node, (str, int, float, type(None))):
        return node
    if isinstance(node, dict):
        return {key: container(value) for key, value in node.items()}
    if isinstance(node, list):
        return [container(value) for value in node]
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    if isinstance(node, Mapping):
        return {key: container(value) for key, value in node.items()}
    return node


# Parts of the identity that this version derives from a config with knowledge of its own (which split a seed gets),
# not read from a value the config holds, with what every record written before the part existed had. A record's
# config cannot say them: they are read from what the record stored (`stored_identity`), never derived again.
DERIVED_KEYS = {"split": None}


def identity_hash(identity: dict) -> str:
    """The first 16 hex digits of the SHA-256 of json.dumps(identity, sort_keys=True, separators=(",", ":"))."""
    return hashlib.sha256(canonical_text(identity)).hexdigest()[:16]


def canonical_text(value) -> bytes:
    """json.dumps(value, sort_keys=True, separators=(",", ":")) as bytes, byte for byte: orjson's text where it is
    that (an eighth of the time: a sweep's start and the tables hash 100,000 identities), else json's. orjson writes
    what json writes but for text json escapes and it does not (non-ASCII, DEL), NaN and infinities (null), integers
    past 64 bits (refused) and floats below 1e-4 (1e-05 is 0.00001 to it): text holding any of these, or what may be
    one (`null`, a digit before an `e`, `0.0000`), is json's."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        text = None
    if text is None or not text.isascii() or b"\x7f" in text or b"null" in text or _UNLIKE_JSON.search(text):
        return _CANONICAL.encode(value).encode()
    return text


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))  # made once (a sweep hashes 100,000 identities)
_UNLIKE_JSON = re.compile(rb"[0-9][eE]|0\.0000")  # an exponent, a float below 1e-4 (json: 1e-05, orjson: 0.00001)


def config_hash(cfg: DictConfig) -> str:
    return identity_hash(semantic_config(cfg))


def stored_identity(record: dict, from_config: dict | None = None) -> dict:
    """The identity of the run that wrote `record`, as that run had it (what its `config_hash` hashes), its model as
    this machine resolves the record's `config` (as a run's own, so the path's spelling never differs).

    A record since issue 32 holds it (`identity`). An older one holds its config, which gives every part but the
    DERIVED_KEYS, and its hash, which decides those: the identity with today's derived parts or with each at its value
    from before it existed, whichever hashes to the record's `config_hash` (with the model as the record spelt it).
    One without a hash: its config, without derived parts. `from_config`: semantic_config of the record's config,
    where the caller has it. Raises (KeyError, ValueError, ...) for a record without a readable config; for a damaged
    record (`damage`) it is not the run's identity.
    """
    if from_config is None:
        from_config = semantic_config(record["config"])
    here = {"model.name": from_config["model.name"]}
    if isinstance(record.get("identity"), dict):
        return {**container(record["identity"]), **here}
    found = _hashed_candidate(record, from_config)
    return {**(found if found is not None else _before_derived(from_config)), **here}


def _before_derived(identity: dict) -> dict:
    """`identity` with each DERIVED_KEYS part at its value from before it existed."""
    return {**{key: value for key, value in identity.items() if key not in DERIVED_KEYS},
            **{key: value for key, value in DERIVED_KEYS.items() if value is not None}}


def _hashed_candidate(record: dict, from_config: dict) -> dict | None:
    """Of the identities a record without `identity` may have had (its config's, with today's derived parts or those
    from before them; its model spelt as the record names it, as this machine resolves it, or as its config gave it
    before paths were normalised), the first that hashes to its `config_hash`; None if none does."""
    config_model = (record["config"].get("model") or {}).get("name") if isinstance(record["config"], Mapping) else None
    models = dict.fromkeys(model for model in (record.get("model"), from_config["model.name"], config_model)
                           if isinstance(model, str))
    for candidate in (from_config, _before_derived(from_config)):
        for model in models:
            if identity_hash({**candidate, "model.name": model}) == record.get("config_hash"):
                return candidate
    return None


# ---------------------------------------------------------------- what a record must be: one reading everywhere

class DamagedRecord(UserError):
    """A run's folder holds a damaged record (`damage`): the run stops at it, and nothing takes it as any run."""


def _is_int(value) -> bool:
    return type(value) is int


def _is_number(value) -> bool:
    return type(value) is float or type(value) is int


class _optional:
    """A check that also passes null (a field a record may leave empty)."""

    __slots__ = ("check",)

    def __init__(self, check) -> None:
        self.check = check

    def __call__(self, value) -> bool:
        return value is None or self.check(value)


def _is_str(value) -> bool:
    return type(value) is str


def _is_dict(value) -> bool:
    return isinstance(value, dict)


def _scores(value) -> bool:
    return isinstance(value, dict) and all(score is None or _is_number(score) for score in value.values())


def _gates(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(layers, list) and all(_is_number(gate) for gate in layers) for layers in value.values())


def _peak(value) -> bool:
    return isinstance(value, dict) and _is_number(value.get("bytes")) and _is_str(value.get("measures"))


def _fused(value) -> bool:
    return isinstance(value, dict) and _is_int(value.get("size")) and _is_str(value.get("group"))


EFFICIENCY_FIELDS = ("trainable_params", "backbone_params", "train_seconds", "train_seconds_share", "train_steps",
                     "eval_seconds", "eval_seconds_share", "test_seconds", "test_examples")
STATUSES = ("ok", "failed", "pruned")


def _passing(check) -> frozenset:
    """The types every value of which passes `check` (a shortcut past calling it: a sweep checks 100,000 records)."""
    if isinstance(check, _optional):
        return _passing(check.check) | {type(None)}
    return {_is_str: frozenset({str}), _is_int: frozenset({int}), _is_number: frozenset({int, float}),
            _is_dict: frozenset({dict, Plain})}.get(check, frozenset())


def _with_passing(fields: tuple) -> tuple:
    return tuple((field, check, expected, required, _passing(check)) for field, check, expected, required in fields)


# (field, check, what it must be, required, the types that pass): every field a reader of records reads (docs/record.md),
# and its type.
FIELDS = _with_passing((
    ("method", _is_str, "a string", True),
    ("task", _is_str, "a string", True),
    ("k", lambda value: value == "all" or (_is_int(value) and value > 0), 'a positive integer or "all"', True),
    ("seed", _is_int, "an integer", True),
    ("status", lambda value: value in STATUSES, '"ok", "failed" or "pruned"', True),
    ("config", _is_dict, "an object", True),
    ("identity", _optional(_is_dict), "an object", False),
    ("config_hash", _optional(_is_str), "a string", False),
    ("model_seed", _optional(_is_int), "an integer", False),
    ("model", lambda value: _is_str(value) and bool(value), "a model name", False),
    ("architecture", _optional(lambda value: _is_str(value) and bool(value)), "a model_type", False),
    ("variant", _optional(_is_str), "a string", False),
    ("error", _optional(_is_str), "a string", False),
    ("test", _optional(_scores), "{metric: number or null}", False),
    ("dev_best", _optional(_scores), "{metric: number or null}", False),
    ("best_epoch", _optional(_is_int), "an integer", False),
    ("epochs_run", _optional(_is_int), "an integer", False),
    *((field, _optional(_is_number), "a number", False) for field in EFFICIENCY_FIELDS),
    ("gates", _optional(_gates), "{submodule: [number per layer]}", False),
    ("fused", _optional(_fused), '{"group": string, "size": integer}', False),
    ("peak_memory", _optional(_peak), '{"bytes": number, "measures": string}', False),
    ("pruned", _optional(_is_dict), "an object", False),
    ("machine", _optional(_is_dict), "an object", False),
    ("precision", _optional(_is_str), "a string", False),
    ("device", _optional(_is_str), "a string", False),
))
CONFIG_FIELDS = _with_passing((
    ("method", _is_dict, "an object", True),
    ("task", _is_dict, "an object", False),
    ("train", _is_dict, "an object", True),
    ("dev_size", _is_int, "an integer", True),
    ("model_seed", _is_int, "an integer", False),
    ("model", _is_dict, "an object", False),
))
# A record's own fields that say what its config says: each must agree with it (readers read one or the other).
AGREEING = (("method", ("method", "name")), ("task", ("task", "name")), ("k", ("k",)), ("seed", ("seed",)),
            ("model_seed", ("model_seed",)))


def damage(record: dict) -> str | None:
    """Why `record` is damaged, in one line, or None: the one validation of a record, which every reader applies
    (a run or sweep deciding whether a run is done: check_existing, peltbench-missing, the sweep's summary; the
    tables), so that none takes a record another reads otherwise. A record is damaged when

    - a field is missing or of the wrong type (FIELDS, CONFIG_FIELDS: `"seed": "17"`, a score that is a string,
      `status` other than ok, failed or pruned), or an ok record has no test scores;
    - a field says other than its config (`seed` 18 where `config.seed` is 17: AGREEING; `model` other than its
      identity's);
    - its stored `identity` does not hash to its `config_hash`, or its config gives another identity than the one
      it stored (a setting edited by hand: which is true cannot be known); or, for a record from before `identity`,
      its config hashes to no `config_hash` it can have had.

    Such a record is no run: the rerun stops at it (DamagedRecord), peltbench-missing and the sweep's summary list it
    as damaged, the tables leave it out, each with this reason. A record of a changed meaning (an identity part
    this version derives otherwise: `changed_meaning`) is not damaged: it is another run. Cheap (a sweep checks
    100,000 records): the fields' types, one hash, and the record's config read once.
    """
    return examine(record, meaning=False)[0]


def examine(record: dict, meaning: bool = True, from_config: dict | None = None) -> tuple[str | None, list[str]]:
    """(why `record` is damaged or None: `damage`; how its meaning changed: `changed_meaning`, [] where it is
    damaged or not `meaning`), its config read once for both. `from_config`: semantic_config of its config, where the
    caller has it (against_run)."""
    why = _field_damage(record, FIELDS, "") or _field_damage(record["config"], CONFIG_FIELDS, "config.")
    if why:
        return why, []
    if record["status"] == "ok" and not isinstance(record.get("test"), dict):
        return "an ok record without test scores (field 'test')", []
    if "model" not in record and not _is_str((record["config"].get("model") or {}).get("name")):
        return "field 'model' is missing", []
    config = record["config"]
    for field, path in AGREEING:
        if field in record:
            value = select(config, ".".join(path), default=_MISSING)
            if value is not _MISSING and value != record[field] and not (type(value) is str and "${" in value):
                return (f"its field '{field}' is {json.dumps(record[field])[:40]} where its config has "
                        f"{json.dumps(value)[:40]} (edited after it was written?)"), []
    identity = record.get("identity")
    rows = identity.get("task.rows") if isinstance(identity, dict) else None
    try:  # a user task's rows as the record has them (its files are not read again)
        if from_config is None:
            from_config = semantic_config(record["config"], rows=rows or "unknown")
    except Exception as error:  # a config no run could have had (a setting missing, a value OmegaConf refuses)
        if record.get("identity") is None and record.get("config_hash") is None:
            return None, []  # nothing to read it against (the tables read what they need of it)
        return f"its config is not a run's config ({type(error).__name__}: {_first_line(error)[:80]})", []
    why = _identity_damage(record, from_config)
    if why or not meaning:
        return why, []
    stored = stored_identity(record, from_config)
    mine = read_as_recorded(stored, from_config)
    return None, [] if stored == mine else _differences(_flat(stored), _flat(mine))


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


_MISSING = object()


def _field_damage(record: dict, fields: tuple, prefix: str) -> str | None:
    for field, check, expected, required, passing in fields:
        value = record.get(field, _MISSING)
        if value is _MISSING:
            if required:
                return f"field '{prefix}{field}' is missing"
        elif type(value) not in passing and not check(value):
            return f"field '{prefix}{field}' is {json.dumps(value)[:40]}, expected {expected}"
    return None


def _identity_damage(record: dict, from_config: dict) -> str | None:
    """Why the record's identity, config (`from_config`: its semantic_config) and hash disagree, or None (`damage`)."""
    identity, digest = record.get("identity"), record.get("config_hash")
    if identity is not None:
        hashed = identity_hash(identity)
        if hashed != digest:
            return f"its identity hashes to {hashed}, not to its config_hash {digest} (edited after it was written?)"
    elif digest is None:
        return None  # nothing to contradict its config (no record peltbench wrote lacks both)
    if identity is None:
        if _hashed_candidate(record, from_config) is None:
            return (f"its config hashes to {identity_hash(from_config)}, not to its config_hash {digest} (edited "
                    f"after it was written?)")
        return None
    if "model" in record and identity.get("model.name") != record["model"]:
        return (f"its field 'model' is {json.dumps(record['model'])[:60]} where its identity has "
                f"{json.dumps(identity.get('model.name'))[:60]} (edited after it was written?)")
    contradicted = _contradictions(identity, from_config)
    if contradicted:
        return f"its config says {', '.join(contradicted)} (edited after it was written?)"
    return None


def _contradictions(identity: dict, from_config: dict) -> list[str]:
    """Where a record's config gives another identity than the one it stored: `method.lr 0.001 where its identity has
    0.0005`, each such key. Not the parts this version derives (DERIVED_KEYS: a changed meaning), nor the code of a
    user's component (read from its module as this process finds it, not from the config: a change is a changed
    meaning, docs/record.md), nor the model's path (the identity holds it as the machine that wrote it resolved it)."""
    if identity == from_config:
        return []
    skip = {*DERIVED_KEYS, "code", "model.name"}
    stored = {key: value for key, value in identity.items() if key not in skip}
    mine = {key: value for key, value in from_config.items() if key not in skip}
    if stored == mine:
        return []
    stored, mine = _flat(stored) if "method" in stored else stored, _flat(mine)
    return [f"{key} {json.dumps(mine.get(key))} where its identity has {json.dumps(stored.get(key))}"
            for key in sorted(stored.keys() | mine.keys()) if stored.get(key, _MISSING) != mine.get(key, _MISSING)]


def against_run(record: dict, cfg: DictConfig | Mapping) -> tuple[str | None, list[str]]:
    """(damage(record), config_differences(record, cfg) where it is not damaged): how the run of `cfg` reads the
    record in its folder (the rerun's check_existing, a sweep's plan, peltbench-missing). Where the record's config is
    the run's own in every node its identity is read from (IDENTITY_NODES: equal, and equal as JSON), and names a
    packaged task, the identity its config gives is the run's (the same function of the same data): worked out once,
    not once for each (a sweep reads 100,000 records; a rerun with another data.dir, results_dir, device or logger
    still takes it)."""
    config, mine = record.get("config"), None
    if type(cfg) is Plain and type(config) in (dict, Plain) and isinstance(record.get("identity"), dict):
        try:
            if _same_identity_nodes(config, cfg) and is_packaged_task(cfg["task"]):
                mine = semantic_config(cfg)
        except Exception:  # a value JSON cannot hold, a config no run could have: read as every reader reads it
            mine = None
    damaged = examine(record, meaning=False, from_config=mine)[0]
    return (damaged, []) if damaged else (None, config_differences(record, cfg, mine))


# The top-level nodes of a config that semantic_config reads where the task is a packaged one (task_identity reads
# data.dir only for a user's task): two such configs equal in these nodes have one identity
# (tests/test_record.py: test_the_identity_of_a_packaged_tasks_run_reads_only_its_identity_nodes).
IDENTITY_NODES = tuple(dict.fromkeys(("method", "task", "protocol", "objective", 
                                      *(key.split(".")[0] for key in (*SEMANTIC_KEYS, *LATER_KEYS)))))


def _same_identity_nodes(config: Mapping, run: Mapping) -> bool:
    """Whether `config` and `run` hold the same IDENTITY_NODES: equal (a quick look first: a record of another
    version's config differs), then equal as JSON (1 is not 1.0, nor True 1)."""
    mine = {key: run[key] for key in IDENTITY_NODES if key in run}
    theirs = {key: config[key] for key in IDENTITY_NODES if key in config}
    return theirs == mine and orjson.dumps(theirs) == orjson.dumps(mine)


def config_differences(record: dict, cfg: DictConfig, mine: dict | None = None) -> list[str]:
    """How the run that wrote `record` differs from `cfg` in what changes results, one `key (record X, this run Y)`
    per setting; [] when it is the same run. The record's identity is read as it stored it (`stored_identity`), and
    compared setting by setting, not only by hash, so that a record whose hash came from another spelling of the same
    settings (model.name=DIR/ before paths were normalised) is this run. `mine`: semantic_config(cfg), where the caller
    has it."""
    mine = semantic_config(cfg) if mine is None else mine
    if record.get("identity") == mine or record.get("config_hash") == identity_hash(mine):
        return []  # the same identity (which damage() finds hashes to config_hash) needs no hash of its own
    try:
        stored = stored_identity(record)
    except Exception:  # no config, or one this version cannot read: only the hashes can be compared
        return [f"config_hash (record {record.get('config_hash')}, this run {identity_hash(mine)})"]
    return _differences(_flat(stored), _flat(read_as_recorded(stored, mine)))


def read_as_recorded(stored: dict, mine: dict) -> dict:
    """`mine` (a run's identity) with the code of each of its user components read by the rule the record whose
    identity is `stored` was made by (component.code_identity_as): a record made before the code's meaning was hashed
    holds `source <hash of the files>`, and is the run of today's code where that rule's hash of today's code is the
    one it holds (docs/record.md, "The identity of a user's code")."""
    theirs, code = stored.get("code"), mine.get("code")
    if not code or not isinstance(theirs, Mapping):
        return mine
    read = {name: code_identity_as(name, theirs.get(name)) for name in code}
    return mine if read == code else {**mine, "code": read}


def changed_meaning(record: dict) -> list[str]:
    """How the run that wrote `record` differs from what its own config means to this version, e.g. `split (record
    None, this run 'lmbff-chained')` for an LM-BFF CoLA record from before the chained split: such a record is not
    this version's run of its config (a rerun of the config stops at it), so no table may show it as that run.
    [] for every record whose meaning did not change, and for a damaged one (`damage` says why)."""
    return examine(record)[1]


def _differences(stored: dict, mine: dict) -> list[str]:
    return [f"{key} (record {stored.get(key)!r}, this run {mine.get(key)!r})"
            for key in sorted(stored.keys() | mine.keys()) if stored.get(key) != mine.get(key)]


def _flat(identity: dict) -> dict:
    identity = dict(identity)
    method, code = identity.pop("method"), identity.pop("code", None) or {}
    objective = identity.pop("objective", None) or LEGACY_OBJECTIVE  # an identity without one: the classifier as before
    return {**{f"method.{key}": value for key, value in method.items()}, **identity,
            **{f"objective.{key}": value for key, value in objective.items()},
            **{f"the code of {name}": value for name, value in code.items()}}


def non_default_settings(cfg: DictConfig | Mapping) -> list[tuple[str, object]]:
    """(key, value) pairs where the run departs from the packaged method file and top-level defaults (`cfg` a config,
    or the same as plain data)."""
    cfg = readable(cfg)
    changes: list[tuple[str, object]] = []
    protocol = protocol_name(cfg)
    method = cfg["method"]
    method_defaults = _method_defaults(str(method["name"]), protocol)
    for key, value in (container(method) if isinstance(method, DictConfig) else method).items():  # read, not kept
        if method_defaults is None or key not in method_defaults or method_defaults[key] != value:
            if key != "name":
                changes.append((key, value))
    task = cfg["task"]  # the protocol's k, seeds, train.* and the task's max_length are not departures
    defaults = _top_defaults(protocol, cfg["seed"], task["name"], task.get("max_length"))
    plain = type(cfg) is Plain or not isinstance(cfg, DictConfig)
    for key, path in _DEPARTING_PATHS:
        value = _walk(cfg, path, None) if plain else select(cfg, key)
        if key == "model.name":
            value = model_identity(str(value))
        if defaults[key] != value:
            changes.append((key, value))
    changes.extend(objective_departures(cfg))  # `objective=cloze`, `objective.pooling=mean`: before the protocol
    if protocol != DEFAULT_PROTOCOL:
        changes.append(("protocol", protocol))
    return changes


def _method_defaults(method: str, protocol: str) -> dict | None:
    """The method's file (conf/method/<method>.yaml, or the user's: packaged.method_file) with the protocol's own method
    settings over it (lmbff: head=train), as plain data; None for a method no file is found for."""
    return _method_file_defaults(method, protocol, user_config_dirs())


@lru_cache(maxsize=None)
def _method_file_defaults(method: str, protocol: str, folders: tuple[str, ...]) -> dict | None:
    """_method_defaults with the user's config folders `folders`. Read once per method and protocol: never change
    what it returns."""
    packaged = method_file(method)
    if packaged is None:
        return None
    return OmegaConf.to_container(OmegaConf.merge(packaged, method_overrides(protocol)), resolve=True)


def _top_defaults(protocol: str, seed, task: str, max_length: int | None = None) -> dict:
    """The values of FOLDER_KEYS and LATER_KEYS that a run of `protocol`, `seed` and `task` (of that `max_length`)
    has unless it says otherwise (protocols.run_defaults). Never change what it returns."""
    return default_values(protocol, seed, task, _DEPARTING, max_length)


_DEPARTING = (*FOLDER_KEYS, *LATER_KEYS)  # the top-level settings a run's folder names where they depart
_DEPARTING_PATHS = tuple((key, tuple(key.split("."))) for key in _DEPARTING)


def _folder_value(key: str, value) -> str:
    if isinstance(value, (list, tuple)):
        value = "+".join(str(v) for v in value)
    value = str(value)
    if key == "model.name" and ("/" in value or os.sep in value):
        value = "_".join(Path(value.rstrip("/")).parts[-2:])  # a Hub id org/name, or a dir's last two parts
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", value)


def variant_name(cfg: DictConfig | Mapping) -> str:
    """The method's folder: its name, then every non-default setting, e.g. `adapter,bottleneck=256`."""
    parts = [cfg["method"]["name"]] + [f"{key}={_folder_value(key, value)}" for key, value in non_default_settings(cfg)]
    return ",".join(parts)


def record_path(cfg: DictConfig | Mapping, results_dir: Path) -> Path:
    """Where the record of `cfg` (a config, or the same as plain data) goes under `results_dir`."""
    return results_dir.joinpath(*record_folder(cfg).split("/"), "result.json")


def record_folder(cfg: DictConfig | Mapping) -> str:
    """The run's folder under results_dir, `variant/task/kK/seedS` (its label in peltbench-missing)."""
    return f"{variant_name(cfg)}/{cfg['task']['name']}/k{cfg['k']}/seed{cfg['seed']}"


# ---------------------------------------------------------------- reading

class NotARecord(ValueError):
    """Why a result.json is not a record at all (not UTF-8, not JSON, not a JSON object), in one line."""


def parse_record(data: bytes, split: bool = True) -> dict:
    """The record a result.json's bytes hold; NotARecord says why they hold none. Its config is a plain.Plain (read
    as plain data) unless the text holds a string OmegaConf reads as more than text (`${`, `???`).

    orjson parses it (the same objects as json.loads, in 0.6 of its time: 100,000 records are read by the tables, a
    sweep's start and peltbench-missing); what orjson refuses (NaN or Infinity, which json.dumps writes for a score
    that is not a number; not UTF-8; not JSON) goes to json.loads, which reads it or says why it is not a record.

    `split=False`, for readers of a record's state and scores (the tables, peltbench-missing, a sweep's plan): its
    `split` (the indices of the rows it trained and selected on: two thirds of its bytes, which no such reader
    reads) is checked as JSON but not read (`_without_split`), and the record has no `split`. Which files are
    records, and every other field, are as with `split=True`."""
    record = None if split else _without_split(data)
    if record is None:
        try:
            record = orjson.loads(data)
        except orjson.JSONDecodeError:
            record = _parse_slowly(data)
        if not isinstance(record, dict):
            raise NotARecord("not a JSON object")
        if not split:
            record.pop("split", None)
    if type(record.get("config")) is dict and not may_hold_omegaconf_strings(data):
        record["config"] = Plain(record["config"])
    return record


def _without_split(data: bytes) -> dict | None:
    """The record `data` holds, without its `split`, where the split is where and as the writer puts it (a top-level
    object on a line of its own: `format_record`): its text is checked to be JSON apart from the rest (once per
    distinct text, by its SHA-256: a sweep's runs of one task, K and seed share their split), and the rest is parsed
    with a stand-in value in its place, which must come out as the record's top-level `split`. Together the two are
    JSON exactly when the whole is (a JSON value can stand anywhere another can). None where any of this does not hold
    (another layout, a split that is no JSON, no record at all): parse_record then parses the whole."""
    at = data.find(_SPLIT_KEY)
    start = at + len(_SPLIT_KEY)
    if at < 0 or data[start:start + 1] != b"{":
        return None
    end = data.find(b"}", start) + 1  # the split holds no object: its first `}` closes it (else: not JSON, below)
    if end == 0:
        return None
    text = data[start:end]
    digest = hashlib.sha256(text).digest()
    try:
        if digest not in _JSON_SPLITS:
            orjson.loads(text)
            if len(_JSON_SPLITS) >= 65536:
                _JSON_SPLITS.clear()
            _JSON_SPLITS.add(digest)
        record = orjson.loads(data[:start] + _STAND_IN + data[end:])
    except orjson.JSONDecodeError:
        return None
    if type(record) is not dict or record.get("split") != _STAND_IN_VALUE:
        return None
    del record["split"]
    return record


_SPLIT_KEY = b'\n  "split": '  # a top-level field, as format_record writes it
_STAND_IN, _STAND_IN_VALUE = b'"\\u0000split"', "\x00split"  # no record's split is this string
_JSON_SPLITS: set[bytes] = set()  # SHA-256 digests of split texts orjson parsed


def _parse_slowly(data: bytes):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotARecord(f"not UTF-8 text (byte {error.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        end = "" if text.rstrip().endswith("}") else " (truncated?)"  # a record is one object: it ends with }
        raise NotARecord(f"not valid JSON: {error.msg} at line {error.lineno} column {error.colno}{end}") from None


def file_bytes(path: Path) -> bytes:
    """A file's bytes, read with the system calls alone: a third of the CPU of Path.read_bytes for a record of 10 kB (the
    tables, a sweep's start and peltbench-missing read 100,000 of them)."""
    handle = os.open(path, os.O_RDONLY)
    try:
        parts = [os.read(handle, READ_BYTES)]
        while parts[-1]:
            parts.append(os.read(handle, READ_BYTES))
    finally:
        os.close(handle)
    return parts[0] if len(parts) == 2 else b"".join(parts)


READ_BYTES = 1 << 16  # a record in one read


def read_record(path: Path, reasons: list[str] | None = None, split: bool = True) -> dict | None:
    """The record at `path`; None if there is none, or only a file that is not a record (parse_record: a rerun
    replaces it; why is appended to `reasons`, where given). `split=False`: without its split (parse_record).

    A record that exists but cannot be read (another user's, without read permission) is a UserError: whether it
    is done cannot be known, and it is not ours to replace.
    """
    try:
        data = file_bytes(path)
    except (FileNotFoundError, NotADirectoryError):  # a results_dir that is a file: probe_writable says so
        return None
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror} (another user's record? its owner can "
                        f"`chmod a+r` it)") from None
    try:
        return parse_record(data, split)
    except NotARecord as error:  # e.g. a file cut off by a full disk under an older version
        if reasons is not None:
            reasons.append(str(error))
        return None


# What `save.KEY=true` keeps beside the record (peltbench.saving writes them): a done run without one that its config
# asks for is trained again (the runner), so it is not done for a sweep's counts or peltbench-missing either.
SAVED = {"weights": "weights.safetensors", "predictions": "predictions.csv"}


def unsaved(cfg: DictConfig | Mapping, folder: Path) -> list[str]:
    """The files `cfg.save` asks for that the run folder lacks, e.g. ["predictions.csv"]."""
    return [name for key, name in SAVED.items() if cfg["save"].get(key) and not (folder / name).is_file()]


def check_existing(path: Path, cfg: DictConfig) -> dict | None:
    """The finished record of this config, if any. A record of a different config is never replaced."""
    existing = read_record(path)
    if existing is None:
        return None
    damaged, differences = against_run(existing, cfg)
    if damaged:
        raise DamagedRecord(f"{path} holds a damaged record: {damaged}; move it away to rerun it")
    if differences:
        raise UserError(f"{path} holds a record of a different config ({'; '.join(differences)}); "
                        f"move it away or choose another results_dir")
    return existing if existing.get("status") == "ok" else None


# ---------------------------------------------------------------- writing

def probe_writable(path: Path) -> None:
    """Make the record's folder and write a probe file where the record will go, so that an unwritable results
    directory, one that is not a directory, or a full disk costs seconds before a run, not the run (a UserError)."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), folder)
        raise UserError(f"cannot write the record {path}: {blocker} is not a directory") from None
    except OSError as error:
        raise UserError(f"cannot create the record's folder {folder}: {error.strerror}") from None
    probe = temporary_name(folder, ".probe.")
    try:
        handle = create(probe)
        try:
            os.write(handle, bytes(PROBE_BYTES))
            os.fsync(handle)
        finally:
            os.close(handle)
        disk = os.statvfs(folder)
        if disk.f_bavail * disk.f_frsize < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, "less than 1 MB free")
    except OSError as error:
        raise UserError(f"cannot write the record in {folder}: {error.strerror}") from None
    finally:
        probe.unlink(missing_ok=True)


def write_record(path: Path, record: dict) -> bool:
    """Write `record` at `path`, whole; False if the record there is kept instead.

    Decided at the rename, under the run folder's lock: a finished (`ok`) record is never replaced by one that is
    not, nor is another config's record. Numbers that are not finite become null, listed in `non_finite` (JSON has
    no NaN). A write that fails is logged and raised as RecordWriteError, so the sweep's summary can say why.
    """
    try:
        text = format_record(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(path.parent) as locked:
            if locked:
                remove_leftovers(path.parent)
            kept = _kept(read_record(path), record)
            if kept:
                log.warning("kept %s: it is %s; this run's %s record is not written", path, kept,
                            record.get("status"))
                return False
            write_file(path, text, ".result.")
    except (OSError, UserError, TypeError) as error:  # TypeError: a value JSON cannot hold
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        failed = f" (the run itself failed: {record.get('error')})" if record.get("status") == "failed" else ""
        message = f"could not write the record {path}: {reason}{failed}"
        log.error("%s", message)
        raise RecordWriteError(message) from error
    return True


def _kept(existing: dict | None, record: dict) -> str | None:
    """Why `existing` must stay instead of `record`, or None."""
    if existing is None:
        return None
    if damage(existing):
        return "a damaged record"
    if existing.get("config_hash") != record.get("config_hash") and isinstance(record.get("config"), dict):
        if config_differences(existing, OmegaConf.create(record["config"])):
            return "another config's record"
    if existing.get("status") == "ok" and record.get("status") != "ok":
        return "a finished record (written meanwhile by another process)"
    return None


# ---------------------------------------------------------------- the format: readable, no NaN

# Scores first, then what the run was, its size and cost, then the long parts. Other fields go before the long ones.
HEAD = ("status", "error", "test", "dev_best", "best_epoch", "best_step", "epochs_run", "method", "variant", "protocol",
        "task", "k", "seed",
        "model_seed", "model", "architecture", "non_finite", "trainable_params", "head_params", "optimizer_params", "backbone_params",
        "train_seconds", "train_seconds_share", "train_steps", "eval_seconds", "eval_seconds_share", "test_seconds",
        "test_examples", "peak_memory", "machine", "device", "precision", "fused", "dropout")
TAIL = ("history", "gates", "split", "data_dir", "data_source", "config", "identity", "config_hash", "schema", "versions",
        "started_at", "finished_at", "traceback")
LINE_WIDTH = 110  # a dict of plain values this short stays on one line


def format_record(record: dict) -> str:
    """The JSON text of a record: fields in HEAD/TAIL order, scores ×100 rounded to 4 decimals and timings to 3,
    lists of numbers on one line, and every NaN or infinity made null (its place and value in `non_finite`)."""
    non_finite: dict[str, str] = {}
    clean = _finite(_rounded(record), "", non_finite)
    if non_finite:
        clean["non_finite"] = {**clean.get("non_finite", {}), **non_finite}
    order = [key for key in HEAD if key in clean] + [key for key in clean if key not in HEAD + TAIL]
    order += [key for key in TAIL if key in clean]
    return _dumps({key: clean[key] for key in order}, 0) + "\n"


def _rounded(record: dict) -> dict:
    """Scores (×100) to 4 decimals, seconds to 3, gates and losses to 6 significant digits: no float noise."""
    def scores(values):
        return {k: _round(v, 4) for k, v in values.items()} if isinstance(values, dict) else values

    out = dict(record)
    for key in ("test", "dev_best"):
        if key in out:
            out[key] = scores(out[key])
    for key in [key for key in out if key.endswith(("_seconds", "_seconds_share"))]:
        out[key] = _round(out[key], 3)
    if isinstance(out.get("history"), list):
        per_field = {"dev_main": lambda v: _round(v, 4), "train_loss": _significant}
        out["history"] = [{k: per_field.get(k, lambda v: v)(v) for k, v in entry.items()} if isinstance(entry, dict)
                          else entry for entry in out["history"]]
    if isinstance(out.get("gates"), dict):
        out["gates"] = {k: [_significant(g) for g in v] if isinstance(v, list) else v for k, v in out["gates"].items()}
    return out


def _round(value, decimals: int):
    return round(value, decimals) if isinstance(value, float) and math.isfinite(value) else value


def _significant(value):
    return float(f"{value:.6g}") if isinstance(value, float) and math.isfinite(value) else value


def _finite(value, where: str, non_finite: dict[str, str]):
    """`value` as plain JSON types (numpy and torch numbers converted), with NaN and ±inf replaced by None."""
    if isinstance(value, Mapping):  # dicts, and OmegaConf's DictConfig
        return {str(k): _finite(v, f"{where}.{k}" if where else str(k), non_finite) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):  # lists, tuples, ListConfig
        return [_finite(v, f"{where}[{i}]", non_finite) for i, v in enumerate(value)]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy / torch scalars and arrays
        return _finite(value.tolist(), where, non_finite)
    if isinstance(value, float) and not math.isfinite(value):
        non_finite[where] = str(value)
        return None
    return value


def _dumps(value, indent: int) -> str:
    line = json.dumps(value, allow_nan=False, separators=(", ", ": "))
    if not isinstance(value, (dict, list)) or not value:
        return line
    plain = all(not isinstance(v, (dict, list)) for v in (value.values() if isinstance(value, dict) else value))
    if plain and (isinstance(value, list) or indent + len(line) <= LINE_WIDTH):
        return line  # e.g. split indices, gates per layer, one epoch of history, a metric dict
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_dumps(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + _dumps(v, indent + 2) for v in value) + "\n" + " " * indent + "]"


# ---------------------------------------------------------------- where and with what it ran

# Packages beside torch and transformers that can change a run's numbers or its export: PEFT (the PEFT copies), the
# numerics (numpy, scipy, scikit-learn: splits, metrics), the data and tokenizer stack, and the config system.
VERSIONED = ("peft", "numpy", "scipy", "scikit-learn", "datasets", "tokenizers", "safetensors", "hydra-core", "omegaconf")


def versions() -> dict:
    """The versions a record names (docs/record.md `versions`): python, torch, transformers, peltbench, the commit, and
    each of VERSIONED that is installed (null when it is not)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers

    found = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peltbench": __version__,
        "git_commit": _git_commit(),
        **found,
    }


def machine(device) -> dict:
    """The machine a run's timings come from: hostname, CPU model, GPU name (null when it ran on the CPU)."""
    gpu = None
    if str(device).startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name(torch.device(device))
    return {"hostname": socket.gethostname(), "cpu": _cpu_model(), "gpu": gpu}


PEAK_RSS = "process_peak_rss"                                 # CPU: the process's lifetime peak (getrusage)
PEAK_RSS_SINCE_GROUP = "process_peak_rss_since_group_start"  # CPU on Linux: VmHWM, reset as the group starts
CLEAR_REFS, STATUS = "/proc/self/clear_refs", "/proc/self/status"


def reset_peak_memory(device) -> str:
    """Start counting the peak memory anew as a group starts (before its model is built), so a record's peak is its
    group's, not that of the sweep process's earlier groups; returns what `peak_memory` will measure (its `measures`).

    CUDA: `torch.cuda.reset_peak_memory_stats`. CPU on Linux: writing 5 to /proc/self/clear_refs sets the process's
    peak resident set (VmHWM) back to what it holds now (proc(5)); what it holds then (the interpreter, torch, the
    runs' data, memory the allocator kept from earlier groups) still counts. Where that file cannot be written (not
    Linux, a kernel or sandbox that refuses it) nothing can be reset: the peak stays the process's lifetime peak.
    """
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(torch.device(device))
        return "cuda_max_memory_allocated"
    try:
        with open(CLEAR_REFS, "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return PEAK_RSS
    return PEAK_RSS_SINCE_GROUP if _high_water_mark() is not None else PEAK_RSS


def peak_memory(device, members: int, measures: str = PEAK_RSS) -> dict:
    """The peak memory the run's training reached, as the device can tell (docs/record.md `peak_memory`);
    `measures`: what `reset_peak_memory` returned when the group started.

    CUDA: `torch.cuda.max_memory_allocated` since the group started: the tensors the caching allocator handed out,
    not what it reserved. CPU: the process's peak resident set size since the group started (VmHWM), or where it
    could not be reset its lifetime peak (`resource.getrusage`), which counts everything the process held since it
    started, earlier runs of the same sweep process included. A fused group shares one backbone and one loop: its
    members all report the group's.
    """
    if str(device).startswith("cuda"):
        import torch

        value, measures = torch.cuda.max_memory_allocated(torch.device(device)), "cuda_max_memory_allocated"
    else:
        value = _high_water_mark() if measures == PEAK_RSS_SINCE_GROUP else None
        if value is None:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
            value, measures = peak if sys.platform == "darwin" else peak * 1024, PEAK_RSS
    return {"bytes": int(value), "measures": measures, "of": "group" if members > 1 else "run"}


def _high_water_mark() -> int | None:
    """The process's peak resident set in bytes since it started or since the last reset (VmHWM); None if unknown."""
    try:
        with open(STATUS) as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


@lru_cache(maxsize=1)
def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or None


@lru_cache(maxsize=1)
def _git_commit() -> str | None:
    """The commit of the peltbench source tree, with `+dirty` if it has uncommitted changes; None outside git."""
    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=source,
                                capture_output=True, text=True, timeout=5)
        return commit.stdout.strip() + ("+dirty" if status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
