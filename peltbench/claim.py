"""Claims: a run being trained is claimed, so that a second sweep started beside the first does not train it too.

    claim = claim_run(record_path)      # None: another live process is running it
    if claim is not None:
        with claim:                     # released (its file deleted) at the end, also on an exception
            ...train and write the record...

A claim is `claim.json` beside the run's record: host, pid, SLURM job, started, heartbeat. One thread per process
refreshes the heartbeat of every claim the process holds (every HEARTBEAT_S). A claim is stale, and the next
process to claim the run takes it over, when its heartbeat is older than STALE_AFTER_S, when its pid is dead on
this host, or when it was left by this very process or an earlier incarnation of this SLURM job (a requeued job
keeps its id). Claims are made, refreshed, taken over and released under the run folder's lock (peltbench.files),
so of two processes claiming one run at once, or taking over one stale claim, exactly one gets it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from datetime import datetime
from pathlib import Path

from . import UserError
from .files import LOCK_NAME, folder_lock, remove_leftovers, write_file

log = logging.getLogger("peltbench")

CLAIM_NAME = "claim.json"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0  # ten missed heartbeats: the holder is dead, hung or cut off from the disk


class Claim:
    """A claim this process holds on one run (a context manager: released on exit)."""

    def __init__(self, path: Path, holder: dict) -> None:
        self.path = path        # the claim file
        self.holder = holder    # what the file says; holder["token"] tells our claim from a later one
        self.released = False

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        """Delete the claim file, if it is still ours. A failure is only logged: the run's own outcome matters more,
        and a claim left behind goes stale. Once only: a run that left its group early released it then, and its folder
        may be gone since (runner._abandon) when the sweep's claims are all released at its end."""
        _beats.discard(self)
        if self.released:
            return
        self.released = True
        try:
            with folder_lock(self.path.parent):
                if _read(self.path)[0].get("token") == self.holder["token"]:
                    self.path.unlink(missing_ok=True)
        except OSError as error:
            log.warning("could not release the claim on %s: %s", self.path.parent, error.strerror)

    def beat(self) -> bool:
        """Refresh the heartbeat; False (and a warning) if the claim is no longer ours: it was taken over. A claim
        released since the heartbeat thread listed it (a member leaving its group) is left alone, without a word."""
        with folder_lock(self.path.parent):
            if self.released:
                return True
            current = _read(self.path)[0]
            if current.get("token") != self.holder["token"]:
                log.warning("lost the claim on %s (now: %s): another process may be running it too",
                            self.path.parent, describe(current) if current else "none")
                return False
            self.holder = {**self.holder, "heartbeat": _now()}
            write_file(self.path, json.dumps(self.holder, indent=2) + "\n", ".claim.")
        return True


def claim_run(record_path: Path) -> Claim | None:
    """Claim the run whose record goes to `record_path`; None if another live process holds it.

    Cheap (a lock, a read and a small write), so a fused group claims each member. A stale claim is taken over.
    Leftover temporary files of a killed writer in the run folder are removed here.
    """
    folder = record_path.parent
    path = folder / CLAIM_NAME
    for attempt in range(3):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with folder_lock(folder) as locked:
                if locked:
                    remove_leftovers(folder)
                current, heartbeat = _read(path)
                if heartbeat is not None and _live(current, heartbeat, path):
                    return None
                if heartbeat is not None:
                    log.info("taking over the stale claim on %s (%s)", folder, describe(current) or "unreadable")
                holder = {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": _slurm_job(),
                          "started": _now(), "heartbeat": _now(), "token": secrets.token_hex(8)}
                # exclusive when there was none: link(2) refuses if a process that could not lock made one meanwhile
                write_file(path, json.dumps(holder, indent=2) + "\n", ".claim.", exclusive=heartbeat is None)
            break
        except FileExistsError:
            return None
        except FileNotFoundError:  # the folder went while we waited for its lock (a stopped run's, tidied): again
            if attempt == 2:
                raise UserError(f"cannot claim the run in {folder}: it keeps being removed") from None
        except OSError as error:
            raise UserError(f"cannot claim the run in {folder}: {error.strerror}") from None
    claim = Claim(path, holder)
    _beats.add(claim)
    return claim


def drop_dead_claim(record_path: Path) -> None:
    """Delete the claim on a finished run if no live process holds it: one left by a process killed in the instant
    between writing the record and releasing the claim (or by a version that released a fused group's claims only
    at the group's end). Best effort: a folder we may not write keeps it, and it misleads no one there."""
    path = record_path.parent / CLAIM_NAME
    if not path.exists():
        return
    try:
        with folder_lock(path.parent):
            current, heartbeat = _read(path)
            if heartbeat is not None and not _live(current, heartbeat, path):
                path.unlink(missing_ok=True)
    except OSError:
        pass


def remove_empty_run_folder(record_path: Path) -> None:
    """Remove the folder of a run that left it holding nothing but its lock: a run stopped (Ctrl-C, SIGTERM) or refused
    once it had started, which wrote no record and released its claim. Its parents up to the results directory go too
    where that leaves them empty, so that no folder suggests a run is there. Under the folder's lock (a process
    waiting on it then finds the folder gone and makes it again: claim_run); best effort."""
    folder = record_path.parent
    try:
        with folder_lock(folder) as locked:
            if not locked or any(entry.name != LOCK_NAME for entry in folder.iterdir()):
                return
            (folder / LOCK_NAME).unlink()
            folder.rmdir()
    except OSError:
        return
    for parent in list(folder.parents)[:3]:  # <results_dir>/<variant>/<task>/k<k>/: the run folder's own parents
        try:
            parent.rmdir()
        except OSError:  # not empty: other runs are there
            return


def live_claim(record_path: Path) -> dict | None:
    """What the live claim on this run says (host, pid, ...), or None if no live process holds it."""
    path = record_path.parent / CLAIM_NAME
    current, heartbeat = _read(path)
    if heartbeat is None or not _live(current, heartbeat, path):
        return None
    return current or {"host": "unknown (the claim file is not readable)"}


def describe(holder: dict) -> str:
    """e.g. `host node12, pid 4242 (SLURM job 55_3), started 2026-01-01T12:00:00+00:00`."""
    if not holder:
        return ""
    job = f" (SLURM job {holder['slurm_job']})" if holder.get("slurm_job") else ""
    started = f", started {holder['started']}" if holder.get("started") else ""
    return f"host {holder.get('host')}, pid {holder.get('pid')}{job}{started}"


def _read(path: Path) -> tuple[dict, float | None]:
    """The claim file's content ({} if unreadable) and its heartbeat (epoch seconds; None: there is no claim).

    A claim we may not read (another user's, mode 0600) or cannot parse counts from its modification time.
    """
    try:
        modified = path.stat().st_mtime
    except OSError:
        return {}, None
    try:
        holder = json.loads(path.read_text())
        return holder, datetime.fromisoformat(holder["heartbeat"]).timestamp()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, modified


def _live(holder: dict, heartbeat: float, path: Path) -> bool:
    if any(claim.path == path for claim in _beats.held()):
        return True  # held by this process
    job = holder.get("slurm_job")
    if job is not None and job == _slurm_job():
        return False  # left by this SLURM job before it was requeued
    if time.time() - heartbeat > STALE_AFTER_S:
        return False
    if holder.get("host") == socket.gethostname():
        return holder.get("pid") != os.getpid() and _pid_alive(holder.get("pid"))
    return True


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _slurm_job() -> str | None:
    return os.environ.get("SLURM_JOB_ID")


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


class _Heartbeat:
    """One daemon thread per process refreshing every held claim; started with the first claim."""

    def __init__(self) -> None:
        self.claims: set[Claim] = set()
        self.guard = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, claim: Claim) -> None:
        with self.guard:
            self.claims.add(claim)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="peltbench-claims", daemon=True)
                self.thread.start()

    def discard(self, claim: Claim) -> None:
        with self.guard:
            self.claims.discard(claim)

    def held(self) -> list[Claim]:
        with self.guard:
            return list(self.claims)

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(min(HEARTBEAT_S, 1.0))
            if time.monotonic() - last < HEARTBEAT_S:
                continue
            last = time.monotonic()
            for claim in self.held():
                try:
                    if not claim.beat():
                        self.discard(claim)
                except OSError as error:  # a full disk or a lost mount: the run goes on, the claim may go stale
                    log.warning("could not refresh the claim on %s: %s", claim.path.parent, error.strerror)


_beats = _Heartbeat()
