"""Read result records (docs/record.md) into one pandas DataFrame, one row per run, with flat columns.

Settings are read from each record's `config`, never from folder names (docs/record.md). Every column a
comparison needs is its own column: each test and dev metric (`test_f1`, `dev_accuracy`, ...), the
`train.*` settings (`train_epochs`, ...), `dev_size`, `model_seed`, `precision`, `model`, its
`architecture` (the model's `model_type`; "bert" for a record that predates the field), and `protocol`, one
string for all of them (comparability.py), so a plain `groupby(["model", "protocol", ...])` cannot pool different
protocols by accident.

A record's method settings (`method_settings`) are its `config.method` with any setting the record predates
filled in as the run had it; they count as the paper's defaults when they agree with `conf/method/<method>.yaml`
on every key that file sets, 2 and 2.0 alike: Tables 1-4 use only those runs; Figures 2 and 3 use the runs that
differ in the one setting they sweep (`bottleneck`, `lora_scale`). Two records of one model, protocol, method,
task, K and seed whose settings agree so are one run, counted once (`one_record_per_seed`).

A file that cannot be read as a record (not UTF-8, not JSON, truncated, a field missing or of the wrong
type) is never guessed at: it is named with its reason and left out.
"""
import gc
import json
import os
import warnings
from functools import lru_cache
from typing import NamedTuple
from operator import itemgetter
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
from omegaconf import OmegaConf

from ..packaged import options, packaged_config
from ..protocols import DEFAULT as DEFAULT_PROTOCOL, method_overrides, protocol_name
from ..progress import progress
from ..record import EFFICIENCY_FIELDS, LATER_METHOD_KEYS, NotARecord, examine, file_bytes, one_pass, parse_record
from .names import METHODS, TASKS, name_users_methods
from .comparability import (TOP_LEVEL_KEYS, architecture_name, canonical, config_defaults, normalize_model,
                            protocol_label, run_protocol)

# A record written before records named their architecture is BERT's: the only one peltbench ran then.
ARCHITECTURE_BEFORE_RECORDED = "bert"
ARCHITECTURE_MARK = "#"  # PATH#roberta: the runs of one model path under one of its architectures (split_architectures)
RECORD_FILE = "result.json"
WEIGHTS_FILE = "weights.safetensors"  # written beside result.json by a run with save.weights=true
NAN = np.nan  # a missing column's value, the object pandas fills a list of dicts with
READING_BAR_DELAY_S = 3.0  # a terminal shows a bar while records are read once reading has taken this long
# EFFICIENCY_FIELDS (record.py): a fused run's `*_seconds` are its group's; `*_seconds_share` its part of them
COLUMNS = (
    "method", "variant", "task", "k", "seed", "model", "architecture", "status", "error", "main", "test_main", "dev_main",
    "best_epoch", "epochs_run", "pruned_at", "dev_size", "model_seed", "precision", "protocol",
    *EFFICIENCY_FIELDS, "peak_memory", "peak_memory_measures", "fused_group", "fused_size", "device", "machine_hostname", "machine_cpu", "machine_gpu",
    "gates", "weights", "settings", "changed", "config", "path",
)


class BadRecord(ValueError):
    """Why a result.json is not a usable record (one line); `kind`: one of SKIPPED."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind


# Why a result.json is left out, as every reader words it: not a record at all (not UTF-8, not JSON, not an object, or
# a file that cannot be read); a damaged record (record.damage); one made when its config meant another run
# (record.changed_meaning).
SKIPPED = {"unreadable": ("unreadable file", "unreadable files"), "damaged": ("damaged record", "damaged records"),
           "changed": ("record of a changed meaning", "records of a changed meaning")}


class Skipped(NamedTuple):
    """A result.json left out: its path, its kind (a key of SKIPPED) and why, in one line."""

    path: str
    kind: str
    reason: str


def read_records(results_dir="results/runs"):
    """(records, skipped): every usable `result.json` under `results_dir` as one row (see `load_records`),
    and a Skipped (path, kind, reason) for each one left out."""
    rows, unreadable = [], []
    found = record_files(results_dir)
    memo = {}  # what depends only on a record's method settings or protocol settings: worked out once per pass
    position = {column: index for index, column in enumerate(COLUMNS)}  # each column's place in a row's list
    collecting = gc.isenabled()
    gc.disable()  # records hold no reference cycles: the collector's passes over 100,000 rows only cost time (20%)
    try:
        with one_pass():
            for path, weights in progress(found, "reading records", unit="record", delay=READING_BAR_DELAY_S):
                try:
                    row = _flatten(_read(path), path, memo, weights)
                except BadRecord as error:
                    unreadable.append(Skipped(path, error.kind, str(error)))
                    continue
                rows.append(_as_list(row, position))
        records = _frame_of_lists(rows, position)  # collector still off: 100,000 rows become a frame
        name_users_methods(users_components(records))  # a user's LoHa is `LoHa` in every table, as a built-in's LoRA
        return records, unreadable
    finally:
        if collecting:
            gc.enable()


def _as_list(row, position):
    """A row dict as a list in `position`'s order (a column seen first here is added to it), NaN where it has none
    (as pandas fills a list of dicts): a tenth of a dict's memory for 100,000 rows."""
    values = [NAN] * len(position)
    for column, value in row.items():
        index = position.get(column)
        if index is None:
            index = position[column] = len(position)
            values.append(NAN)
        values[index] = value
    return values


def _frame_of_lists(rows, position):
    """The frame `_frame` makes of the same rows as dicts: COLUMNS, then the others in `_extra_order`."""
    extra = sorted(set(position) - set(COLUMNS), key=_extra_order)
    order = [position[column] for column in [*COLUMNS, *extra]]
    width = len(position)
    take = itemgetter(*order)
    table = [take(row if len(row) == width else row + [NAN] * (width - len(row))) for row in rows]
    rows.clear()
    return split_architectures(pd.DataFrame(table, columns=[*COLUMNS, *extra]))


def record_files(results_dir):
    """[(path, weights)]: every `result.json` under `results_dir` as `sorted(Path(results_dir).rglob("result.json"))`
    finds it (the same paths in the same order, symlinked folders not followed), and whether its folder holds a
    `weights.safetensors` file. One listing per folder, no other look at the disk (100,000 records: 2 s, not 5); a
    folder that cannot be listed, or is gone meanwhile (a concurrent sweep removes an empty run folder), is skipped."""
    root = Path(results_dir)
    if not root.is_dir():
        return []
    found, folders = [], [str(root)]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as listing:
                entries = {entry.name: entry for entry in listing}
        except (PermissionError, FileNotFoundError, NotADirectoryError):
            continue
        prefix = "" if folder == "." else folder if folder.endswith("/") else folder + "/"
        for name, entry in entries.items():
            if _is_dir(entry) and not entry.is_symlink():
                folders.append(prefix + name)
        record = entries.get(RECORD_FILE)
        if record is not None and (not record.is_symlink() or os.path.exists(record.path)):
            weights = entries.get(WEIGHTS_FILE)
            found.append((prefix + RECORD_FILE, weights is not None and _is_file(weights)))
    found.sort(key=lambda item: item[0].split("/"))  # Path's order: part by part
    return found


def _is_dir(entry):
    try:
        return entry.is_dir()
    except OSError:
        return False


def _is_file(entry):
    try:
        return entry.is_file()
    except OSError:
        return False


def load_records(results_dir="results/runs"):
    """Every readable `result.json` under `results_dir` as one row of a DataFrame; for notebooks too.

    Columns: `COLUMNS`, then one per test metric (`test_mcc`, ...), dev metric (`dev_mcc`, ...) and
    `train.*` setting (`train_epochs`, ...). `k` is a string ("100", "all") so one column holds both;
    `main` (= `test_main`) is NaN where the run failed or the metric is undefined; `changed` lists the
    method settings that differ from the method's defaults, e.g. `("bottleneck",)`. A file that is not a
    usable record is left out with a one-line warning naming it.
    """
    records, skipped = read_records(results_dir)
    for path, kind, reason in skipped:
        warnings.warn(f"{path}: {SKIPPED[kind][0]}, skipped: {reason}", stacklevel=2)
    return records


def _frame(rows):
    extra = sorted({column for row in rows for column in row} - set(COLUMNS), key=_extra_order)
    return split_architectures(pd.DataFrame(rows, columns=[*COLUMNS, *extra]))


def split_architectures(records):
    """One model path whose records name two architectures (a checkpoint replaced in place) is two models: each
    gets `PATH#<model_type>` as its `model`, so no render pools them (`architecture_conflicts` names them)."""
    counts = records.groupby("model")["architecture"].nunique()
    mixed = records["model"].isin(counts[counts > 1].index)
    if mixed.any():
        records = records.copy()
        records.loc[mixed, "model"] = records.loc[mixed, "model"] + ARCHITECTURE_MARK + records.loc[mixed, "architecture"]
    return records


def architecture_conflicts(records):
    """One line per model path whose records name several architectures (`split_architectures`), e.g. `model
    /ckpt/x: its records name 2 architectures (BERT: 2 runs, RoBERTa: 1 run), a checkpoint replaced in place? ...`."""
    split = records[records["model"].str.contains(ARCHITECTURE_MARK, regex=False)]
    lines = []
    for base, runs in split.groupby(split["model"].str.rsplit(ARCHITECTURE_MARK, n=1).str[0], sort=True):
        counts = runs.groupby("model").size()
        names = ", ".join(f"{architecture_name(runs.loc[runs['model'] == model, 'architecture'].iloc[0])}: {count} "
                          f"run{'s' if count != 1 else ''}" for model, count in counts.items())
        lines.append(f"model {base}: its records name {len(counts)} architectures ({names}), a checkpoint replaced in "
                     f"place? Never pooled: they render apart as {' and '.join(counts.index)} (--model chooses one)")
    return lines


def _extra_order(column):
    """test_* before dev_* before train_*, each alphabetical."""
    return (["test_", "dev_", "train_"].index(column[: column.index("_") + 1]) if "_" in column else 3, column)


def known_runs(records):
    """(known, unknown): runs of a method and task peltbench has, and the rest (listed, never a row or column). A
    task of the user's own (a task file of their config folder, issue 46) is known by its records' config, which
    holds the task file: it gets a column of its own (the papers have no number for it). A method of the user's own
    (a method file of their config folder, issue 45) is known by its records' components: each a built-in's name or
    a module's import path (docs/components.md)."""
    own_task = records["config"].map(own_task_file) & ~records["task"].isin(known_names("task"))
    methods = known_names("method") | user_methods(records)
    known = records["method"].isin(methods) & (records["task"].isin(known_names("task")) | own_task)
    return records[known], records[~known]


def own_task_file(config) -> bool:
    """Whether a record's config holds a task file of the present form (its rows, classes and metric named)."""
    task = config.get("task") if isinstance(config, dict) else None
    return isinstance(task, dict) and all(key in task for key in ("text", "label", "num_labels", "main_metric")) \
        and ("files" in task or "dataset" in task)


def user_methods(records):
    """The methods of `records` that peltbench does not ship, made of named components (a user's method file)."""
    return set(users_components(records))


def users_components(records):
    """{method: its components} for each method of `records` that peltbench does not ship, made of named components
    (a user's method file), as its first record names them."""
    from ..component import check_name

    ours = known_names("method")
    found = {}
    for method, config in zip(records["method"].tolist(), records["config"].tolist()):  # a str column: a list
        if method in ours or method in found:
            continue
        components = (config.get("method") or {}).get("components")
        if isinstance(components, list) and components and all(check_name(str(name)) is None for name in components):
            found[method] = tuple(map(str, components))
    return found


def known_names(group):
    """The methods (group "method") or tasks ("task") the tables have rows or columns for."""
    return set(METHODS if group == "method" else TASKS) | _packaged(group)


def default_runs(records):
    """Runs whose method settings are all the paper's defaults (the rows of Tables 1-4)."""
    return records[records["changed"].map(len) == 0]


def swept_runs(records, method, setting):
    """Runs of `method` that differ from the defaults in `setting` at most (Figure 2: bottleneck, Figure 3: lora_scale).

    Adds the swept value as column `value`, taken from the record's config or, for a default run, the default.
    """
    runs = records[(records["method"] == method) & records["changed"].map(lambda keys: set(keys) <= {setting})]
    default = method_defaults(method).get(setting)
    values = runs["settings"].map(lambda settings: settings.get(setting, default))
    return runs.assign(value=pd.to_numeric(values, errors="coerce")).dropna(subset=["value"])


def one_record_per_seed(runs):
    """(kept, duplicates): each seed of one method setting, task and K counted once.

    Two records of one seed under one model and protocol (e.g. `model.name=DIR` and `DIR/`) are kept
    once when they agree (same status and score); when they disagree neither is counted: which one is
    right is not for the tables to guess. `duplicates` holds every record of such seeds, with `duplicate`
    = "same result" or "different results".
    """
    if runs.empty:
        return runs, runs.assign(duplicate=pd.Series(dtype=str))
    parts = runs[["model", "protocol", "method", "task", "k", "seed"]].astype(str)
    keys = parts["model"].str.cat([parts[column] for column in parts.columns[1:]], sep="|")
    spelt = {}  # canonical text of each settings dict (rows with equal settings share one: read_records)
    settings = runs["settings"].map(lambda value: spelt[id(value)] if id(value) in spelt else
                                    spelt.setdefault(id(value), canonical(value)))
    keys = keys + "|" + settings  # filled in (`method_settings`), and 2 is 2.0
    outcome = runs["status"] + "|" + runs["main"].map(repr)
    repeated = keys.duplicated(keep=False)
    agreeing = outcome.groupby(keys).transform("nunique") == 1
    kept = runs[~repeated | (agreeing & ~keys.duplicated(keep="first"))]
    duplicates = runs[repeated].assign(duplicate=agreeing[repeated].map({True: "same result", False: "different results"}))
    return kept, duplicates


def _read(path):
    """The record at `path`, judged as every reader judges it (record.damage, record.changed_meaning); BadRecord
    says why it is left out."""
    try:
        data = file_bytes(path)
    except OSError as error:
        raise BadRecord("unreadable", error.strerror or type(error).__name__) from None
    try:
        record = parse_record(data, split=False)  # no table reads the row indices
    except NotARecord as error:
        raise BadRecord("unreadable", str(error)) from None
    damaged, changed = examine(record)
    if damaged:
        raise BadRecord("damaged", f"{damaged}; move it away to rerun it")
    if changed:  # e.g. an LM-BFF CoLA record of the old split: not this version's run of its config (docs/record.md)
        raise BadRecord("changed", f"made when its config meant another run ({'; '.join(changed)}): rerun it (move "
                        "this record away first)")
    return record


def _flatten(record, path, memo=None, weights=None):
    """One record as a flat row; optional fields that are absent become None (a failed run has null scores).
    `memo`: a dict that one pass over many records shares (read_records): rows with equal method settings share
    one `settings` dict, and a protocol label is worked out once per distinct set of its inputs. `weights`: whether the
    run's folder holds weights.safetensors (None: look)."""
    memo = {} if memo is None else memo
    config = _shared_parts(record["config"], memo)
    method = record["method"]
    settings, changed = _method_part(method, config["method"], protocol_name(config), memo)
    if method not in _packaged("method"):  # a user's method: its departures from its file are in its folder's name
        changed = variant_changes(record.get("variant"), config["method"])
    precision = _precision(record)
    test, dev = record.get("test") or {}, record.get("dev_best") or {}
    fused, machine = record.get("fused") or {}, record.get("machine") or {}
    peak = record.get("peak_memory") or {}
    model = record.get("model") or config["model"]["name"]
    folder = os.path.dirname(str(path))
    weights_path = os.path.join(folder, WEIGHTS_FILE) if folder else WEIGHTS_FILE
    if weights is None:
        weights = os.path.isfile(weights_path)
    row = {
        "method": method, "variant": record.get("variant") or method, "task": record["task"],
        "k": str(record["k"]), "seed": record["seed"], "model": normalize_model(model),
        "architecture": record.get("architecture") or ARCHITECTURE_BEFORE_RECORDED,
        "status": record["status"], "error": record.get("error"),
        "main": _score(test.get("main")), "test_main": _score(test.get("main")), "dev_main": _score(dev.get("main")),
        "best_epoch": record.get("best_epoch"), "epochs_run": record.get("epochs_run"),
        "pruned_at": (record.get("pruned") or {}).get("rung"),  # successive halving stopped it there (peltbench.halving)
        "dev_size": config["dev_size"], "model_seed": config.get("model_seed"), "precision": precision,
        "protocol": _protocol_part(config, precision, memo),
        "peak_memory": peak.get("bytes"), "peak_memory_measures": peak.get("measures"),
        "fused_group": fused.get("group"), "fused_size": fused.get("size"), "device": record.get("device"),
        "machine_hostname": machine.get("hostname"), "machine_cpu": machine.get("cpu"), "machine_gpu": machine.get("gpu"),
        "gates": record.get("gates"), "weights": weights_path if weights else None,
        "settings": settings, "changed": changed, "config": config,
        "path": str(path),
    }
    row.update({field: record.get(field) for field in EFFICIENCY_FIELDS})
    row.update({f"test_{metric}": _score(score) for metric, score in test.items() if metric != "main"})
    row.update({f"dev_{metric}": _score(score) for metric, score in dev.items() if metric != "main"})
    row.update({f"train_{key}": value for key, value in _train_settings(config).items()})
    return row


def _shared_parts(config, memo):
    """`config` with each of its dicts and lists (`method`, `task`, `train`, ...) replaced by an equal one that earlier
    records of the pass gave (records of one sweep repeat them): a config's parsed parts take 12 KB, 1.2 GB for
    100,000 records. Rows share them: read them, never change them in place (load_records)."""
    return {key: _memo(memo, ("config", key), value, lambda value: value) if isinstance(value, (dict, list)) else value
            for key, value in config.items()}


def _method_part(method, config_method, protocol, memo):
    """(method_settings, changed_settings) of a record's method settings, once per distinct method, protocol and
    settings in a pass."""
    def parts(config_method):
        settings = method_settings(method, config_method, protocol)
        return settings, changed_settings(method, settings, protocol)

    return _memo(memo, ("method", method, protocol), config_method, parts)


def _protocol_part(config, precision, memo):
    """protocol_label(run_protocol(config, precision)), once per distinct set of what it reads in a pass."""
    name = protocol_name(config)
    named = name != DEFAULT_PROTOCOL  # a named protocol's own settings depend on the task and seed too
    reads = [config["train"], {key: config[key] for key in TOP_LEVEL_KEYS if key in config}, name, precision,
             config.get("objective")]
    if named:
        reads += [(config.get("task") or {}).get("name"), config.get("seed")]
    return _memo(memo, ("protocol",), reads, lambda reads: protocol_label(run_protocol(config, precision)))


def _memo(memo, kind, value, make):
    """make(value), once per distinct plain `value` of its `kind` in a pass. Values are told apart by their JSON text
    (orjson: a fifth of the time of repr; repr where orjson refuses one), and a value whose text an unequal one had
    (NaN and null are both `null`) is made alone."""
    try:
        text = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # e.g. an integer past 64 bits
        text = repr(value)
    found = memo.get((*kind, text))
    if found is None:
        found = memo[(*kind, text)] = value, make(value)
    elif found[0] is not value and found[0] != value:
        return make(value)
    return found[1]


def _train_settings(config):
    """Every `train.*` setting of the run; one the record predates counts at conf/config.yaml's default."""
    return {**config_defaults()["train"], **config["train"]}


def _precision(record):
    """The precision the run used: the record's own field, else `config.precision` unless that was `auto`."""
    if record.get("precision"):
        return record["precision"]
    configured = record["config"].get("precision")
    return configured if isinstance(configured, str) and configured != "auto" else None


def _score(value):
    """JSON has no NaN: an undefined metric is null (docs/record.md); the frame holds it as NaN."""
    return float("nan") if value is None else float(value)


def variant_changes(variant, settings):
    """The method settings a run's folder name (`variant`: `my_lora,lora_rank=16,model.name=...`) says depart from its
    method's file: how a user's method (whose file the tables do not read) is told from its default runs, as the run
    named it (record.variant_name)."""
    parts = str(variant or "").split(",")[1:]
    return tuple(sorted({part.split("=", 1)[0] for part in parts} & set(settings)))


def method_settings(method, settings, protocol=DEFAULT_PROTOCOL):
    """A record's method settings as its run had them: `config.method`, and a setting the record predates at the
    value that reproduces the behaviour from before it (`record.LATER_METHOD_KEYS`, e.g. `gate_pooling: masked`),
    else at the method file's default (under its protocol's settings: lmbff's head=train). Values are as recorded
    (compare them with `protocol.canonical`)."""
    defaults = method_defaults(method, protocol)
    later = {key: value for key, value in LATER_METHOD_KEYS.items() if key in defaults}
    return {**defaults, **later, **settings}


def changed_settings(method, settings, protocol=DEFAULT_PROTOCOL):
    """Keys of the method settings whose value differs from `conf/method/<method>.yaml` with the run's protocol's
    method settings over it (a protocol's head=train is no departure) (sorted tuple)."""
    defaults = method_defaults(method, protocol)
    return tuple(sorted(key for key, value in settings.items()
                        if key in defaults and canonical(value) != canonical(defaults[key])))


@lru_cache(maxsize=None)
def method_defaults(method, protocol=DEFAULT_PROTOCOL):
    """The method's default settings from its packaged config file (`conf/method/<method>.yaml`), with the method
    settings protocol `protocol` sets over them; {} if none. Read once per method and protocol (a results dir holds
    thousands of records): never change what it returns."""
    if method not in _packaged("method"):
        return {}
    return {**OmegaConf.to_container(packaged_config(f"method/{method}.yaml"), resolve=True), **method_overrides(protocol)}


@lru_cache(maxsize=None)
def _packaged(group):
    """The names a config group offers (read once: a results dir holds thousands of records)."""
    return frozenset(options(group))

