"""Read result records (docs/record.md) into one pandas DataFrame, one row per run.

Settings are read from each record's `config`, never from folder names (docs/record.md). A record's
method settings count as the paper's defaults when `config.method` agrees with `conf/method/<method>.yaml`
on every key that file sets: Tables 1-4 use only those runs; Figures 2 and 3 use the runs that differ
in the one setting they sweep (`bottleneck`, `lora_scale`).
"""
import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from ..packaged import packaged_config

COLUMNS = (
    "method", "variant", "task", "k", "seed", "model", "status", "error", "main",
    "trainable_params", "backbone_params", "train_seconds", "train_steps", "test_seconds", "test_examples",
    "gates", "settings", "changed", "config", "path",
)
EFFICIENCY_FIELDS = ("trainable_params", "backbone_params", "train_seconds", "train_steps", "test_seconds", "test_examples")


def load_records(results_dir="results/runs"):
    """Every `result.json` under `results_dir` as one row of a DataFrame (columns: `COLUMNS`).

    `k` is a string ("100", "all") so that one column holds both; `main` is `test.main` (NaN where the
    run failed or the metric is undefined); `changed` lists the method settings that differ from the
    method's defaults, e.g. `("bottleneck",)`. Usable from a notebook: `load_records("results/runs")`.
    """
    rows = [_flatten(_read(path), path) for path in sorted(Path(results_dir).rglob("result.json"))]
    return pd.DataFrame(rows, columns=list(COLUMNS))


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


def _read(path):
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a valid result record ({error})") from error


def _flatten(record, path):
    """One record as a flat row; missing optional fields become None (a failed run has null scores)."""
    config = record.get("config") or {}
    settings = config.get("method") if isinstance(config.get("method"), dict) else {}
    method = record.get("method") or settings.get("name")
    row = {
        "method": method,
        "variant": record.get("variant", method),
        "task": record.get("task"),
        "k": str(record.get("k")),
        "seed": record.get("seed"),
        "model": record.get("model"),
        "status": record.get("status", "ok"),
        "error": record.get("error"),
        "main": _score((record.get("test") or {}).get("main")),
        "gates": record.get("gates"),
        "settings": settings,
        "changed": changed_settings(method, settings),
        "config": config,
        "path": str(path),
    }
    row.update({field: record.get(field) for field in EFFICIENCY_FIELDS})
    return row


def _score(value):
    """JSON has no NaN: an undefined metric is null (docs/record.md); the frame holds it as NaN."""
    return float("nan") if value is None else float(value)


def changed_settings(method, settings):
    """Keys of `config.method` whose value differs from `conf/method/<method>.yaml` (sorted tuple)."""
    defaults = method_defaults(method)
    return tuple(sorted(key for key, value in settings.items() if key in defaults and value != defaults[key]))


def method_defaults(method):
    """The method's default settings from its packaged config file (`conf/method/<method>.yaml`); {} if none."""
    defaults = packaged_config(f"method/{method}.yaml")
    return OmegaConf.to_container(defaults, resolve=True) if defaults is not None else {}
