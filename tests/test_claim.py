"""Claims: one process trains a run at a time; a dead or silent holder's claim is taken over by exactly one process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from peltbench import claim as claims
from peltbench.claim import CLAIM_NAME, claim_run, describe, live_claim, remove_empty_run_folder

HOLD = """
import sys, time
from pathlib import Path
from peltbench.claim import claim_run
claim = claim_run(Path(sys.argv[1]))
print("got" if claim else "none", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold(record: Path, seconds: float = 60) -> subprocess.Popen:
    """Another process that claims `record` and holds it for `seconds`; returns once it has tried."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(record), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "got"
    return process


def write_claim(record: Path, **fields) -> None:
    now = datetime.now().astimezone().isoformat(timespec="seconds")
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": None, "started": now, "heartbeat": now,
              "token": "theirs", **fields}
    record.parent.mkdir(parents=True, exist_ok=True)
    (record.parent / CLAIM_NAME).write_text(json.dumps(holder))


def ago(seconds: float) -> str:
    return (datetime.now().astimezone() - timedelta(seconds=seconds)).isoformat(timespec="seconds")


def test_a_claim_is_a_file_beside_the_record_until_released(tmp_path):
    record = tmp_path / "run" / "result.json"
    with claim_run(record) as claim:
        stored = json.loads((record.parent / CLAIM_NAME).read_text())
        assert {k: stored[k] for k in ("host", "pid")} == {"host": socket.gethostname(), "pid": os.getpid()}
        assert set(stored) == {"host", "pid", "slurm_job", "started", "heartbeat", "token"}
        assert claim_run(record) is None  # held, here by this very process
        assert live_claim(record)["token"] == claim.holder["token"]
    assert sorted(os.listdir(record.parent)) == [".lock"]
    assert claim_run(record) is not None


def test_released_on_an_exception(tmp_path):
    record = tmp_path / "result.json"
    with pytest.raises(RuntimeError), claim_run(record):
        raise RuntimeError("training failed")
    assert not (tmp_path / CLAIM_NAME).exists()


def test_a_live_process_keeps_its_claim_and_a_killed_ones_is_taken_over(tmp_path):
    record = tmp_path / "result.json"
    holder = hold(record)
    try:
        assert claim_run(record) is None
        assert describe(live_claim(record)).startswith(f"host {socket.gethostname()}, pid {holder.pid}, started ")
    finally:
        holder.kill()
        holder.wait()
    assert live_claim(record) is None  # dead pid on this host: stale at once
    with claim_run(record) as claim:
        assert claim.holder["pid"] == os.getpid()


@pytest.mark.parametrize("fields,live", [
    ({"host": "elsewhere", "pid": 1}, True),                                # another host: its heartbeat is fresh
    ({"host": "elsewhere", "pid": 1, "heartbeat": ago(400)}, False),        # ... silent for over 5 minutes
    ({"pid": 2 ** 22 + 1}, False),                                          # this host, no such process
    ({}, False),                                                            # left by this process, not held by it
    ({"host": "elsewhere", "slurm_job": "77"}, False),                      # this SLURM job before its requeue
])
def test_stale_claims(tmp_path, monkeypatch, fields, live):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    record = tmp_path / "result.json"
    write_claim(record, **fields)
    assert (live_claim(record) is not None) == live
    claim = claim_run(record)
    assert (claim is None) == live
    if claim is not None:
        claim.release()


def test_a_dead_claim_on_a_finished_run_is_dropped_a_live_one_kept(tmp_path):
    """Issue 21, 3b: a claim left on a done run (its process killed just after the record) is removed by the next
    process that finds the run done; another host's live claim and this process's own stay."""
    record = tmp_path / "result.json"
    write_claim(record, pid=2 ** 22 + 1)  # this host, no such process
    claims.drop_dead_claim(record)
    assert not (tmp_path / CLAIM_NAME).exists()
    write_claim(record, host="elsewhere", pid=1)
    claims.drop_dead_claim(record)
    assert (tmp_path / CLAIM_NAME).exists()
    (tmp_path / CLAIM_NAME).unlink()
    with claim_run(record):
        claims.drop_dead_claim(record)
        assert (tmp_path / CLAIM_NAME).exists()


def test_an_unreadable_claim_counts_from_its_modification_time(tmp_path):
    record = tmp_path / "result.json"
    (tmp_path / CLAIM_NAME).write_text("{not json")  # e.g. another user's claim we may not read
    assert claim_run(record) is None
    old = time.time() - 400
    os.utime(tmp_path / CLAIM_NAME, (old, old))
    assert claim_run(record) is not None


def test_of_several_processes_taking_over_a_stale_claim_exactly_one_gets_it(tmp_path):
    record = tmp_path / "result.json"
    write_claim(record, host="elsewhere", heartbeat=ago(1000))
    takers = [subprocess.Popen([sys.executable, "-c", HOLD, str(record), "3"], stdout=subprocess.PIPE, text=True)
              for _ in range(4)]
    answers = sorted(taker.stdout.readline().strip() for taker in takers)
    for taker in takers:
        taker.kill()
        taker.wait()
    assert answers == ["got", "none", "none", "none"]


def test_the_heartbeat_refreshes_the_claim(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.2)
    record = tmp_path / "result.json"
    write_claim(record, host="elsewhere", heartbeat=ago(1000))
    with claim_run(record) as claim:
        first = json.loads((tmp_path / CLAIM_NAME).read_text())
        first_beat = first["heartbeat"]
        deadline = time.monotonic() + 10
        while json.loads((tmp_path / CLAIM_NAME).read_text())["heartbeat"] == first_beat:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.1)
        assert json.loads((tmp_path / CLAIM_NAME).read_text())["token"] == claim.holder["token"]


def test_a_claim_taken_over_is_not_refreshed_nor_deleted_by_its_old_holder(tmp_path, caplog):
    record = tmp_path / "result.json"
    claim = claim_run(record)
    write_claim(record, host="elsewhere", token="the new holder's")  # taken over while this process was stopped
    assert not claim.beat()
    assert "lost the claim" in caplog.text
    claim.release()
    assert json.loads((tmp_path / CLAIM_NAME).read_text())["token"] == "the new holder's"


def test_a_claim_released_while_the_heartbeat_runs_is_not_called_lost(tmp_path, caplog):
    """The heartbeat thread lists the claims it holds, then beats each: a member that left its group in between (its
    claim released, its file gone) was warned about as "lost the claim ... (now: none)"."""
    claim = claim_run(tmp_path / "result.json")
    claim.release()
    assert claim.beat()
    assert "lost the claim" not in caplog.text and not (tmp_path / CLAIM_NAME).exists()


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664)])
def test_claims_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with claim_run(tmp_path / "result.json"):
            assert os.stat(tmp_path / CLAIM_NAME).st_mode & 0o777 == mode
    finally:
        os.umask(old)


def test_claiming_removes_what_a_killed_writer_left(tmp_path):
    (tmp_path / ".result.0a1b2c.tmp").write_text('{"status": "ok", "te')
    (tmp_path / ".claim.0a1b2c.tmp").write_text("{")
    with claim_run(tmp_path / "result.json"):
        assert sorted(os.listdir(tmp_path)) == [".lock", CLAIM_NAME]


def test_a_run_folder_left_holding_only_its_lock_is_removed_with_its_empty_parents(tmp_path):
    """A run stopped (Ctrl-C, SIGTERM) or refused once started writes no record: its folder is not left holding only
    `.lock` (issue 32, 6); a folder holding anything else, or beside other runs, stays."""
    results = tmp_path / "results"
    record = results / "lora" / "rte" / "k16" / "seed111" / "result.json"
    beside = results / "lora" / "rte" / "k16" / "seed222" / "result.json"
    for path in (record, beside):
        claim_run(path).release()
        assert sorted(p.name for p in path.parent.iterdir()) == [".lock"]
    remove_empty_run_folder(record)
    assert not record.parent.exists() and beside.parent.is_dir()  # k16 holds another run
    remove_empty_run_folder(beside)
    assert list(results.iterdir()) == []  # the results directory itself stays
    with claim_run(record):  # the next run of it makes the folder again
        assert (record.parent / CLAIM_NAME).is_file()
        remove_empty_run_folder(record)  # a live claim: the folder stays
        assert (record.parent / CLAIM_NAME).is_file()
    record.write_text("{}")
    remove_empty_run_folder(record)
    assert record.is_file()
