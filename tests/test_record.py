"""Records are written atomically, finished ones are kept, and a different config is never overwritten."""

from __future__ import annotations

import json
import os

import pytest

from peltbench import UserError
from peltbench.record import check_existing, read_record, write_record


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a" / "result.json"
    write_record(path, {"status": "ok", "config_hash": "h"})
    write_record(path, {"status": "ok", "config_hash": "h", "n": 2})
    assert read_record(path)["n"] == 2
    assert os.listdir(path.parent) == ["result.json"]


def test_a_failed_write_keeps_the_old_record(tmp_path):
    path = tmp_path / "result.json"
    write_record(path, {"status": "ok", "config_hash": "h"})
    with pytest.raises(ValueError):
        write_record(path, {"status": "ok", "score": float("nan")})  # NaN is not JSON: refused, nothing replaced
    assert read_record(path) == {"status": "ok", "config_hash": "h"}
    assert os.listdir(tmp_path) == ["result.json"]


def test_check_existing(tmp_path):
    path = tmp_path / "result.json"
    assert check_existing(path, "h") is None
    write_record(path, {"status": "failed", "config_hash": "h"})
    assert check_existing(path, "h") is None  # a failed run is retried
    write_record(path, {"status": "ok", "config_hash": "h"})
    assert check_existing(path, "h") == {"status": "ok", "config_hash": "h"}
    with pytest.raises(UserError, match="holds a record of a different config"):
        check_existing(path, "other")


def test_an_unreadable_record_is_rerun(tmp_path):
    path = tmp_path / "result.json"
    path.write_text('{"status": "ok", "conf')  # e.g. a file cut off by a full disk
    assert check_existing(path, "h") is None
    assert json.loads(json.dumps(read_record(path))) is None
