"""Records: written whole and readable, never NaN, a finished one never replaced, the model named one way."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from omegaconf import OmegaConf

from conftest import a_record, compose_config
from peltbench import UserError
from peltbench import record as record_module
from peltbench import files as files_module
from peltbench.files import folder_lock, write_file
from peltbench.plain import Plain
from peltbench.record import (NotARecord, RecordWriteError, check_existing, config_differences, config_hash, format_record,
                              model_identity, parse_record, probe_writable, read_record, record_path, write_record)


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as strict JSON readers (JavaScript, jq) do."""
    def refuse(constant):
        raise ValueError(f"{constant} in the record")
    return json.loads(text, parse_constant=refuse)


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a" / "result.json"
    assert write_record(path, a_record())
    assert write_record(path, a_record(n=2))
    assert read_record(path)["n"] == 2
    assert sorted(os.listdir(path.parent)) == [".lock", "result.json"]  # the folder's lock file stays


def test_non_finite_numbers_become_null_with_where_and_what(tmp_path):
    path = tmp_path / "result.json"
    record = {"status": "ok", "config_hash": "h", "test": {"spearman": float("nan"), "main": float("nan")},
              "history": [{"epoch": 1, "train_loss": float("inf"), "dev_main": np.float32(50.0)}],
              "gates": {"adapter": np.array([0.25, np.nan])}}
    write_record(path, record)
    stored = strict_json(path.read_text())
    assert stored["test"] == {"spearman": None, "main": None}
    assert stored["history"] == [{"epoch": 1, "train_loss": None, "dev_main": 50.0}]
    assert stored["gates"] == {"adapter": [0.25, None]}
    assert stored["non_finite"] == {"test.spearman": "nan", "test.main": "nan", "history[0].train_loss": "inf",
                                    "gates.adapter[1]": "nan"}


def test_a_readable_record_scores_first_compact_lists_no_float_noise():
    record = {"config": {"k": 100}, "split": {"train_indices": list(range(40)), "dev_indices": [3, 1]},
              "history": [{"epoch": 1, "train_loss": 0.6931471805599453, "dev_main": 51.23456789}],
              "train_seconds": 12.3456789, "best_epoch": 1, "test": {"mcc": 41.987654321, "main": 41.987654321},
              "status": "ok", "machine": {"hostname": "n1", "cpu": "EPYC", "gpu": None}, "newfield": 1}
    text = format_record(record)
    assert list(json.loads(text)) == ["status", "test", "best_epoch", "train_seconds", "machine", "newfield",
                                      "history", "split", "config"]
    lines = text.splitlines()
    assert '  "test": {"mcc": 41.9877, "main": 41.9877},' in lines  # scores x100 to 4 decimals
    assert '  "train_seconds": 12.346,' in lines
    assert '    {"epoch": 1, "train_loss": 0.693147, "dev_main": 51.2346}' in lines
    assert f'    "train_indices": {list(range(40))},' in lines  # a list of numbers is one line
    assert '  "machine": {"hostname": "n1", "cpu": "EPYC", "gpu": null},' in lines


SPLITS = [{"train_indices": [4676, 0, 7083, 10], "dev_indices": list(range(0, 3000, 7))},
          {"train_indices": None, "dev_indices": None},  # k = all
          {"train_indices": [5, 3], "dev_indices": [], "glue_dev_selection": [0], "glue_dev_test": [1, 2]}]  # full_halves


def split_record(split) -> bytes:
    record = {"status": "ok", "test": {"main": 1.0}, "history": [{"epoch": 1, "dev_main": 2.0}], "split": split,
              "config": {"k": 100, "method": {"name": "lora"}}, "identity": {"k": 100}}
    return format_record(record).encode()


def test_a_record_read_without_its_split_is_the_record_less_its_split():
    for split in SPLITS:
        data = split_record(split)
        full = parse_record(data)
        assert full["split"] == split
        assert record_module._without_split(data) is not None  # the writer's layout: its split is not read
        assert parse_record(data, split=False) == {key: value for key, value in full.items() if key != "split"}
        assert parse_record(data, split=False) == parse_record(data, split=False)  # its split's text known by now
    for not_an_object in (b"[" + data + b"]", b"[1]"):
        for split in (True, False):
            with pytest.raises(NotARecord, match="not a JSON object"):
                parse_record(not_an_object, split=split)
    other_layout = json.dumps(json.loads(split_record(SPLITS[0]))).encode()  # all on one line: read whole
    assert record_module._without_split(other_layout) is None
    assert "split" not in parse_record(other_layout, split=False)


@pytest.mark.parametrize("text, changed", [
    ("[4676, 0, 7083, 10]", "[4676, 0, 7083 10]"), ("[4676, 0, 7083, 10]", "[4676, 00, 7083, 10]"),
    ("[4676, 0, 7083, 10]", "[4676, , 7083, 10]"), ("[4676, 0, 7083, 10]", "[4676, 0, 7083, 10"),
    ('"train_indices"', '"train_indices'), ('"dev_indices": [0, 7,', '"dev_indices": [0, 7,}'),
    ("[4676, 0, 7083, 10]", "[4676, NaN, 7083, 10]"),  # json.loads reads NaN: a record, with its split
    ('"train_indices"', '"train_indices", "train_indices"'), ('"test"', '"split": {}, "test"'),
    ('"history"', '"split": 1, "history"'), ('"history"', '"split": "\\u0000split", "history"'),
    ('"config"', '"split": {"dev_indices": [0]},\n  "config"'), ('"config"', '"split": "\\u0000split",\n  "config"'),
    ('"test": {', '"test": {\n  "split": {"a": [1]}, '),  # a `split` of another object, in the writer's layout
])
def test_a_split_read_or_not_gives_the_same_verdict_and_fields(text, changed):
    """Whether the split is read or only checked (split=False: the tables, peltbench-missing, a sweep's plan), the
    same files are records, with the same fields: a split that is not JSON, another `split` before or after it, a
    stand-in's own text."""
    data = split_record(SPLITS[0])
    parse_record(data, split=False)  # its split's text known as JSON: a damaged copy of it must still be found
    assert text.encode() in data
    damaged = data.replace(text.encode(), changed.encode(), 1)
    try:
        full = parse_record(damaged)
    except NotARecord as error:
        with pytest.raises(NotARecord) as without:
            parse_record(damaged, split=False)
        assert str(without.value) == str(error)
    else:
        assert parse_record(damaged, split=False) == {key: value for key, value in full.items() if key != "split"}


def test_a_finished_record_is_never_replaced_by_a_failed_one(tmp_path):
    path = tmp_path / "result.json"
    finished = a_record()
    write_record(path, a_record(status="failed", error="first try"))
    assert write_record(path, finished)  # a failed run is retried and replaced
    assert not write_record(path, a_record(status="failed", error="RuntimeError: late"))
    assert read_record(path) == json.loads(format_record(finished))


def test_the_decision_is_taken_at_the_rename(tmp_path):
    """A failed run that reaches its write while another process is writing the finished record keeps the latter."""
    path = tmp_path / "result.json"
    outcome = []
    with folder_lock(tmp_path):  # the other process, in the middle of its write
        writer = threading.Thread(target=lambda: outcome.append(
            write_record(path, a_record(status="failed", error="boom"))))
        writer.start()
        time.sleep(0.3)
        assert writer.is_alive() and not path.exists()  # waiting for the lock
        write_file(path, format_record(a_record()), ".result.")
    writer.join(10)
    assert outcome == [False] and read_record(path)["status"] == "ok"


def test_another_configs_record_is_never_replaced_at_the_rename(tmp_path):
    cfg = compose_config("method=adapter", "task=rte")
    other = compose_config("method=adapter", "task=rte", "method.bottleneck=64")
    path = tmp_path / "result.json"
    write_record(path, a_record("method=adapter", "task=rte", "method.bottleneck=64", status="failed"))
    assert not write_record(path, a_record())
    assert read_record(path)["config_hash"] == config_hash(other) != config_hash(cfg)


def test_check_existing(tmp_path):
    cfg = compose_config("method=adapter", "task=rte")
    path = tmp_path / "result.json"
    assert check_existing(path, cfg) is None
    finished = a_record()
    write_record(path, a_record(status="failed"))
    assert check_existing(path, cfg) is None  # a failed run is retried
    write_record(path, finished)
    assert check_existing(path, cfg) == json.loads(format_record(finished))


def test_a_different_config_is_refused_naming_the_keys_that_differ(tmp_path):
    stored = compose_config("method=adapter", "task=rte", "method.bottleneck=64", "train.epochs=3")
    path = tmp_path / "result.json"
    write_record(path, a_record("method=adapter", "task=rte", "method.bottleneck=64", "train.epochs=3"))
    with pytest.raises(UserError) as error:
        check_existing(path, compose_config("method=adapter", "task=rte", "method.bottleneck=256", "train.epochs=3"))
    assert str(error.value) == (f"{path} holds a record of a different config (method.bottleneck (record 64, this run "
                                f"256)); move it away or choose another results_dir")
    path.write_text(json.dumps({"status": "ok", "config_hash": "0123456789abcdef"}))  # not a record peltbench wrote
    with pytest.raises(UserError, match=r"holds a damaged record: field 'method' is missing; move it away to rerun it"):
        check_existing(path, compose_config("method=adapter", "task=rte"))


def test_an_unreadable_record_is_rerun(tmp_path):
    path = tmp_path / "result.json"
    cfg = compose_config("method=adapter", "task=rte")
    for damaged in (b'{"status": "ok", "conf', b"\xff\xfe\x00garbage", b"[1, 2]"):  # cut off, not UTF-8, not a record
        path.write_bytes(damaged)
        assert read_record(path) is None and check_existing(path, cfg) is None


def test_a_record_we_may_not_read_is_one_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    write_record(path, {"status": "ok", "config_hash": "h"})

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(record_module, "file_bytes", denied)  # a colleague's record, mode 0600 (root reads anything)
    with pytest.raises(UserError, match=rf"^cannot read {path}: Permission denied \(another user's record\?"):
        read_record(path)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_records_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_record(tmp_path / "r" / "result.json", {"status": "ok", "config_hash": "h"})
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "r" / "result.json").st_mode & 0o777 == mode


def test_a_temporary_file_left_by_a_kill_is_removed_by_the_next_write(tmp_path):
    path = tmp_path / "result.json"
    (tmp_path / ".result.abc123.tmp").write_text('{"status": "o')  # kill -9 between write and rename
    (tmp_path / "notes.tmp").write_text("the user's")
    write_record(path, {"status": "ok", "config_hash": "h"})
    assert sorted(os.listdir(tmp_path)) == [".lock", "notes.tmp", "result.json"]


def test_a_failed_write_is_logged_and_raised_with_its_reason(tmp_path, monkeypatch, caplog):
    path = tmp_path / "result.json"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("peltbench.record.write_file", full)
    with caplog.at_level(logging.ERROR, logger="peltbench"), pytest.raises(RecordWriteError) as error:
        write_record(path, {"status": "failed", "config_hash": "h", "error": "RuntimeError: CUDA out of memory"})
    assert str(error.value) == (f"could not write the record {path}: No space left on device "
                                f"(the run itself failed: RuntimeError: CUDA out of memory)")
    assert caplog.messages == [str(error.value)]


# ---------------------------------------------------------------- the probe write

def test_probe_makes_the_folder_and_leaves_nothing(tmp_path):
    path = tmp_path / "runs" / "adapter" / "rte" / "k100" / "seed111" / "result.json"
    probe_writable(path)
    assert path.parent.is_dir() and os.listdir(path.parent) == []


def test_probe_a_results_dir_that_is_a_file(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    path = tmp_path / "runs" / "adapter" / "rte" / "result.json"
    with pytest.raises(UserError, match=rf"^cannot write the record {path}: {tmp_path / 'runs'} is not a directory$"):
        probe_writable(path)


@pytest.mark.parametrize("code,reason", [(errno.EACCES, "Permission denied"), (errno.ENOSPC, "No space left on device"),
                                         (errno.EROFS, "Read-only file system")])
def test_probe_an_unwritable_or_full_disk(tmp_path, monkeypatch, code, reason):
    def refuse(path):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("peltbench.record.create", refuse)
    with pytest.raises(UserError, match=rf"^cannot write the record in {tmp_path / 'x'}: {reason}$"):
        probe_writable(tmp_path / "x" / "result.json")


def test_probe_a_nearly_full_disk(tmp_path, monkeypatch):
    real = os.statvfs(tmp_path)

    class Nearly:
        f_bavail, f_frsize = 10, real.f_frsize

    monkeypatch.setattr("peltbench.record.os.statvfs", lambda path: Nearly)
    with pytest.raises(UserError, match="less than 1 MB free"):
        probe_writable(tmp_path / "result.json")
    assert os.listdir(tmp_path) == []  # the probe itself is gone


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_probe_a_folder_without_write_permission(tmp_path):
    (tmp_path / "shared").mkdir(mode=0o555)
    with pytest.raises(UserError, match="Permission denied"):
        probe_writable(tmp_path / "shared" / "adapter" / "result.json")


# ---------------------------------------------------------------- one model, one identity

def test_a_local_model_has_one_identity_however_it_is_spelled(tmp_path, monkeypatch):
    model = tmp_path / "models" / "my-bert"
    model.mkdir(parents=True)
    (tmp_path / "link").symlink_to(model)
    monkeypatch.chdir(tmp_path)
    spellings = [str(model), f"{model}/", "models/my-bert", "./models/my-bert/", "link", str(tmp_path / "link")]
    configs = [compose_config("method=adapter", "task=rte", f"model.name={name}") for name in spellings]
    assert {config_hash(cfg) for cfg in configs} == {config_hash(configs[0])}
    assert {record_path(cfg, Path("r")) for cfg in configs} == {Path("r/adapter,model.name=models_my-bert/rte/k100/seed111/result.json")}
    assert model_identity("link") == str(model.resolve()) and model_identity("bert-base-uncased") == "bert-base-uncased"


def test_records_written_before_keep_their_hash():
    """Literals computed by the code before model paths were normalised: absolute real paths and Hub ids."""
    assert config_hash(compose_config("method=adapter", "task=rte", "model.name=/models/bert-base")) == "15b441a18c3c6577"
    assert config_hash(compose_config("method=adapter", "task=rte")) == "36f1b919c79800d9"


def test_an_identitys_canonical_text_is_jsons_byte_for_byte():
    """identity_hash hashes json.dumps(sort_keys=True, separators=(",", ":")): orjson's faster text is used only where
    it is the same, whatever the values (floats of every size, NaN, text json escapes, integers past 64 bits)."""
    import random
    import struct

    from peltbench.plain import Plain
    from peltbench.record import canonical_text

    rng = random.Random(0)
    floats = [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(3000)]
    floats += [m * 10.0 ** e for e in range(-12, 20) for m in (1, 1.5, 2, 2.5, 3, 5, 7.77)]
    floats += [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-4, 9.999e-5, 1e16, 1e15]
    values = [*floats, None, True, False, 0, -3, 2 ** 63 - 1, 2 ** 64, 10 ** 17, "é", "".join(map(chr, range(128))),
              "3e", "a/b", "", [1, (2, 3.5)], {"b": 1, "a": {"d": 2e-05, "c": [None]}}, Plain(z=1, y=2)]
    for value in values:
        identity = {"method": {"name": "lora", "lr": value, "lora_rank": 8}, "task": "rte", "k": 100, "seed": 111}
        assert canonical_text(identity) == json.dumps(identity, sort_keys=True, separators=(",", ":")).encode(), value
    assert canonical_text({"method": {"lr": 5e-4}, "seed": 1}) == orjson.dumps({"method": {"lr": 5e-4}, "seed": 1},
                                                                                 option=orjson.OPT_SORT_KEYS)


class _Reads(Plain):
    """A run's config as plain data that notes which of its top-level keys are read."""

    __slots__ = ()
    read: set = set()

    def __getitem__(self, key):
        _Reads.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        _Reads.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        _Reads.read.add(key)
        return super().__contains__(key)


@pytest.mark.parametrize("protocol", ["unipelt", "lmbff", "full_median"])
def test_the_identity_of_a_packaged_tasks_run_reads_only_its_identity_nodes(protocol):
    """against_run takes a record's identity from its run's config where the two hold the same IDENTITY_NODES: so
    semantic_config, for a packaged task, reads no other top-level key, and a config of those nodes alone gives the
    identity the whole config gives (a rerun with another data.dir, results_dir or device is the same run)."""
    from peltbench.record import IDENTITY_NODES, semantic_config

    for method, task, more in [("lora", "rte", ()), ("unipelt_apl", "cola", ("seed=13",)), ("adapter", "stsb", ()),
                               ("ft", "mrpc", ("train.max_steps=20", "train.eval_every=5"))]:
        cfg = Plain(OmegaConf.to_container(compose_config(f"method={method}", f"task={task}", f"protocol={protocol}",
                                                          "data.dir=/elsewhere", "results_dir=/other", *more),
                                           resolve=True))
        _Reads.read = set()
        assert semantic_config(_Reads(cfg)) == semantic_config(cfg)
        assert _Reads.read and _Reads.read <= set(IDENTITY_NODES), _Reads.read - set(IDENTITY_NODES)
        alone = Plain({key: cfg[key] for key in IDENTITY_NODES if key in cfg})
        assert semantic_config(alone) == semantic_config(cfg)


def test_a_record_differing_from_its_run_only_where_no_identity_is_read_takes_the_runs_identity(monkeypatch):
    """A record of the run with another data.dir (the same GLUE files elsewhere): its identity taken from the run's
    config, and it is this run; with an edited learning rate (identity untouched) it is damaged as before."""
    from peltbench.record import against_run, semantic_config

    record = a_record("method=lora", "task=rte")  # written with the GLUE files from the Hub (data.dir null)
    cfg = Plain(OmegaConf.to_container(compose_config("method=lora", "task=rte", "data.dir=/elsewhere"), resolve=True))
    identity = semantic_config(cfg)
    assert record["config"]["data"]["dir"] is None and record["identity"] == identity
    given = []
    examine = record_module.examine
    monkeypatch.setattr(record_module, "examine", lambda record, meaning=True, from_config=None:
                        given.append(from_config) or examine(record, meaning, from_config))
    assert against_run(record, cfg) == (None, [])
    assert given == [identity]
    edited = {**record, "config": {**record["config"], "method": {**cfg["method"], "lr": 0.5}}}
    given.clear()
    damaged, _ = against_run(edited, cfg)
    assert given == [None] and "method.lr 0.5 where its identity has" in damaged


def test_an_old_record_of_another_spelling_is_the_same_run(tmp_path, monkeypatch):
    model = tmp_path / "bert"
    model.mkdir()
    monkeypatch.chdir(tmp_path)
    old = compose_config("method=adapter", "task=rte", "model.name=bert/")
    record = {"status": "ok", "config_hash": "a hash of 'bert/' as a string", "config": OmegaConf.to_container(old)}
    assert config_differences(record, compose_config("method=adapter", "task=rte", f"model.name={model}")) == []
    other = compose_config("method=adapter", "task=rte", "model.name=bert-base-cased")
    assert config_differences(record, other) == [f"model.name (record {str(model)!r}, this run 'bert-base-cased')"]


def test_peak_memory_on_the_cpu_is_the_process_peak_rss_and_a_group_says_so():
    import resource

    from peltbench.record import peak_memory

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    alone, group = peak_memory("cpu", 1), peak_memory("cpu", 4)  # no reset: the process's lifetime peak
    assert alone["measures"] == "process_peak_rss" and alone["bytes"] >= before > 0
    assert (alone["of"], group["of"]) == ("run", "group")


def test_a_groups_cpu_peak_counts_from_its_start_not_the_process_lifetime():
    """A sweep process that held 256 MB more for an earlier group: the next group's peak, reset as it starts, leaves
    them out (Linux: /proc/self/clear_refs resets VmHWM)."""
    import mmap
    import resource

    from peltbench.record import peak_memory, reset_peak_memory

    def resident(size):  # fresh pages from the system, every one touched: whatever the heap kept from earlier tests
        block = mmap.mmap(-1, size)
        for page in range(0, size, mmap.PAGESIZE):
            block[page] = 1
        return block

    resident(256 * 2 ** 20).close()  # an earlier group's memory, given back
    lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    measures = reset_peak_memory("cpu")
    if measures == "process_peak_rss":
        pytest.skip("/proc/self/clear_refs is not writable here (not Linux, or a kernel or sandbox that refuses it): "
                    "the CPU peak cannot be reset and stays the process's lifetime peak")
    peak = peak_memory("cpu", 1, measures)
    assert peak["measures"] == "process_peak_rss_since_group_start"
    assert 0 < peak["bytes"] <= lifetime - 200 * 2 ** 20  # the earlier 256 MB are not in it
    held = resident(64 * 2 ** 20)  # this group's own memory counts
    assert peak_memory("cpu", 1, measures)["bytes"] >= peak["bytes"] + 60 * 2 ** 20
    held.close()
