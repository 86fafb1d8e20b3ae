"""Result records: where a run's `result.json` lives, what identifies its config, atomic writing.

The format is documented field by field in docs/record.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import tempfile
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from . import UserError, __version__
from .packaged import packaged_config

SCHEMA = 1
# Top-level settings that change results (besides method and task). Where the results go, where the data
# comes from (Hub or an identical local copy), the device and evaluation batch size do not.
SEMANTIC_KEYS = ("k", "seed", "model_seed", "dev_size", "model.name", "train.epochs", "train.patience",
                 "train.batch_size", "train.max_length", "train.grad_clip")
FOLDER_KEYS = SEMANTIC_KEYS[2:]  # k and seed have folders of their own; the rest join the variant name


# Method settings added after records existed, with the value that reproduces the behaviour from before they
# existed: at that value they are left out of the identity, so earlier records keep their hash.
LATER_METHOD_KEYS = {"gate_pooling": "masked"}


def semantic_config(cfg: DictConfig) -> dict:
    """Everything that identifies an experiment: the method's settings, the task, and SEMANTIC_KEYS."""
    method = OmegaConf.to_container(cfg.method, resolve=True)
    for key, value in LATER_METHOD_KEYS.items():
        if method.get(key) == value:
            del method[key]
    identity = {"method": method, "task": cfg.task.name}
    for key in SEMANTIC_KEYS:
        identity[key] = OmegaConf.select(cfg, key)
    return identity


def config_hash(cfg: DictConfig) -> str:
    canonical = json.dumps(semantic_config(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def non_default_settings(cfg: DictConfig) -> list[tuple[str, object]]:
    """(key, value) pairs where the run departs from the packaged method file and top-level defaults."""
    changes: list[tuple[str, object]] = []
    method_defaults = packaged_config(f"method/{cfg.method.name}.yaml")
    for key, value in OmegaConf.to_container(cfg.method, resolve=True).items():
        if method_defaults is None or key not in method_defaults or method_defaults[key] != value:
            if key != "name":
                changes.append((key, value))
    defaults = packaged_config("config.yaml")
    for key in FOLDER_KEYS:
        value = OmegaConf.select(cfg, key)
        if defaults is None or OmegaConf.select(defaults, key) != value:
            changes.append((key, value))
    return changes


def _folder_value(key: str, value) -> str:
    if isinstance(value, (list, tuple)):
        value = "+".join(str(v) for v in value)
    value = str(value)
    if key == "model.name" and ("/" in value or os.sep in value):
        value = "_".join(Path(value.rstrip("/")).parts[-2:])  # a Hub id org/name, or a dir's last two parts
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", value)


def variant_name(cfg: DictConfig) -> str:
    """The method's folder: its name, then every non-default setting, e.g. `adapter,bottleneck=256`."""
    parts = [cfg.method.name] + [f"{key}={_folder_value(key, value)}" for key, value in non_default_settings(cfg)]
    return ",".join(parts)


def record_path(cfg: DictConfig, results_dir: Path) -> Path:
    return results_dir / variant_name(cfg) / cfg.task.name / f"k{cfg.k}" / f"seed{cfg.seed}" / "result.json"


def read_record(path: Path) -> dict | None:
    """The record at `path`, or None if there is none (or only an unreadable one, which a rerun replaces)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def check_existing(path: Path, digest: str) -> dict | None:
    """The finished record for this config, if any. A record of a different config is never replaced."""
    existing = read_record(path)
    if existing is None:
        return None
    if existing.get("config_hash") != digest:
        raise UserError(
            f"{path} holds a record of a different config (hash {existing.get('config_hash')}, this run {digest}); "
            f"move it away or choose another results_dir"
        )
    return existing if existing.get("status") == "ok" else None


def write_record(path: Path, record: dict) -> None:
    """Write atomically: a reader sees the old record or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=2, allow_nan=False) + "\n"
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".result.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def versions() -> dict:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peltbench": __version__,
        "git_commit": _git_commit(),
    }


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
