"""Mid-run checkpoints: a group in training (a separate run is a group of one) saved whole, so that the same command
run again, or its requeued SLURM job, goes on from it and writes the records an uninterrupted run writes.

    checkpoint = Checkpointer(members, folders, every_minutes, extra, resume)   # runner._train_group
    fit(..., checkpoint=checkpoint)   # train.Training calls due() and save() at step boundaries
    checkpoint.leave(folder)          # a run's record is written: its checkpoint goes

The file is `checkpoint.pt` in the folder of each run of the group that still trains (beside its record to be), one
file hard-linked into each (a copy where the file system has no hard links): the whole group at one step boundary
(train.Training.state: trained tensors, optimiser, early stopping, data order, random generators, AdaLoRA's budget,
the period in progress, every member's history) with what the runner keeps per run (its loggers' state, when it
started), and a header: the group's members (label, config hash, config, how far each is), the training code's
digest, a generation number. It is written as a temporary file, then renamed over the last one (so never read half
written), and the group's members keep their own link until their record is written.

A checkpoint resumes only the group it was written for, as that group: members whose records exist by now (they
finished after it was written) or that this job does not run train along again to keep the others' numbers, and
write nothing. It is refused, in one line, and its run starts over, when it is damaged, of another config, of another
format, or from a peltbench whose training code differs (`training_code`).

Imports torch only where a file is read or written: peltbench.missing reads a header with it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from . import __version__
from .files import create, temporary_name

log = logging.getLogger("peltbench")

NAME = "checkpoint.pt"
TEMPORARY = ".checkpoint."  # + a random part + ".tmp": a write in progress, or one a killed process left
FORMAT = 1
# The modules whose code decides what training computes: a checkpoint from a peltbench whose copies of them differ is
# refused (another version may train otherwise). Paths under peltbench/; a folder stands for its .py files.
TRAINING_CODE = ("train.py", "runner.py", "data.py", "model.py", "architectures.py", "metrics.py", "tasks.py",
                 "protocols.py", "halving.py", "allocator.py", "checkpoint.py", "methods")

_progressed = False  # this process has trained since it started (peltbench_slurm: max_num_timeout counts progress)


class Refused(Exception):
    """A checkpoint that cannot resume its run (the message says why)."""


@lru_cache(maxsize=1)
def training_code() -> str:
    """A digest of the training code (TRAINING_CODE) and of torch's and transformers' versions."""
    import torch
    import transformers

    root = Path(__file__).resolve().parent
    digest = hashlib.sha256(f"{FORMAT} {torch.__version__} {transformers.__version__}".encode())
    for name in TRAINING_CODE:
        path = root / name
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(str(source.relative_to(root)).encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def progressed() -> bool:
    """Whether this process has trained anything since it started: a checkpoint further on than where its group
    started, or a run finished (`mark_progress`)."""
    return _progressed


def mark_progress() -> None:
    global _progressed
    _progressed = True


@dataclass
class Resumed:
    """A checkpoint that resumes a group: its content, and for each member of its group the index of the job's run
    that is that member (absent: the member trains along, writing nothing)."""

    payload: dict
    runs: dict[int, int] = field(default_factory=dict)  # member position in the group -> the job's run index
    where: Path | None = None

    @property
    def members(self) -> list[dict]:
        return self.payload["members"]

    def line(self) -> str:
        """`epoch 12 of 50` (the furthest member), for the log."""
        return describe_progress(max(self.members, key=lambda member: member["progress"]["done"])["progress"])


class Checkpointer:
    """Writes a group's checkpoints (`save`), when one is due (`due`: every `every_minutes`, None: never by time) or
    a stop signal asks; `resume`: the checkpoint it goes on from (the loop's state is `resume.payload["loop"]`).

    `members`: per member of the group, its label, config hash and config (plain); `folders`: its run folder where
    this job writes its checkpoint (None: a member that trains along only); `extra()`: what the runner keeps per
    member, saved beside the loop's state (`runs`)."""

    def __init__(self, members: list[dict], folders: list[Path | None], every_minutes: float | None,
                 extra: Callable[[], list[dict]], resume: Resumed | None = None) -> None:
        self.members, self.folders, self.extra = members, list(folders), extra
        self.every = None if not every_minutes else float(every_minutes) * 60
        self.group = resume.payload["group"] if resume else secrets.token_hex(8)
        self.generation = int(resume.payload["generation"]) if resume else 0
        self.resume = resume.payload["loop"] if resume else None
        self.started = int(resume.payload["steps"]) if resume else 0
        self.last = time.monotonic()
        self.written = False

    def due(self) -> bool:
        return self.every is not None and time.monotonic() - self.last >= self.every

    def leave(self, folder: Path) -> None:
        """A run's record is written: its checkpoint goes (the others' stays)."""
        self.folders = [None if f == folder else f for f in self.folders]
        remove(folder)

    def save(self, state: Callable[[], dict], progress: dict) -> None:
        """Write the group's checkpoint now: `state()` the loop's (train.Training.state), `progress` how far it is
        (`steps` done, each member's). A failure is logged and training goes on (a later one may succeed)."""
        global _progressed
        folders = [folder for folder in self.folders if folder is not None]
        self.last = time.monotonic()
        if not folders:
            return
        started = time.perf_counter()
        payload = {
            "format": FORMAT, "training": training_code(), "peltbench": __version__, "group": self.group,
            "generation": self.generation + 1, "steps": progress["steps"],
            "members": [{**member, "progress": done} for member, done in zip(self.members, progress["members"])],
            "loop": state(), "runs": self.extra(),
        }
        try:
            size = _write(payload, folders)
        except OSError as error:
            log.warning("could not write the checkpoint in %s: %s; training goes on", folders[0],
                        error.strerror or error)
            return
        self.generation += 1
        self.written = True
        if progress["steps"] > self.started:
            _progressed = True
        log.info("checkpoint: %s written in %.1fs (%s, %d run folder%s)", _where(progress), time.perf_counter() - started,
                 _size(size), len(folders), "" if len(folders) == 1 else "s")


def _where(progress: dict) -> str:
    training = [member for member in progress["members"] if member["training"]]
    return describe_progress(max(training or progress["members"], key=lambda member: member["done"]))


def describe_progress(progress: dict) -> str:
    """`epoch 12 of 50`, `epoch 12 of 50 (+3 steps)`, `step 400 of 1000`: what a member has done of what it plans."""
    into = progress.get("steps_into_next")
    return f"{progress['unit']} {progress['done']} of {progress['of']}" + (f" (+{into} step{'s' * (into > 1)})" if into else "")


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MB" if size >= 2**20 else f"{size / 2**10:.0f} kB"


def _write(payload: dict, folders: list[Path]) -> int:
    """Write `payload` to each folder's checkpoint.pt whole: a temporary file in the first folder, flushed to disk,
    hard-linked into the others and renamed over each folder's checkpoint (copied where hard links fail)."""
    import torch

    first = folders[0]
    temporary = temporary_name(first, TEMPORARY)
    try:
        with os.fdopen(create(temporary), "wb") as out:
            torch.save(payload, out)
            out.flush()
            os.fsync(out.fileno())
        for folder in folders[1:]:
            link = temporary_name(folder, TEMPORARY)
            try:
                os.link(temporary, link)
            except OSError:  # a file system without hard links: a copy
                shutil.copyfile(temporary, link)
            try:
                os.replace(link, folder / NAME)
            except BaseException:
                link.unlink(missing_ok=True)
                raise
        size = temporary.stat().st_size
        os.replace(temporary, first / NAME)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return size


def remove(folder: Path) -> None:
    """Remove the run folder's checkpoint (best effort: a folder we may not write keeps it, and no one resumes it
    then: peltbench-missing and the runner only read checkpoints of runs without a record)."""
    try:
        (folder / NAME).unlink(missing_ok=True)
    except OSError:
        pass


def clean(folder: Path) -> None:
    """Remove the temporary files of a checkpoint write that was killed; call it holding the run's claim (no one else
    writes a checkpoint there then)."""
    for entry in folder.glob(f"{TEMPORARY}*.tmp"):
        try:
            entry.unlink()
        except OSError:
            pass


def exists(folder: Path) -> bool:
    return (folder / NAME).is_file()


def read(folder: Path) -> dict:
    """The checkpoint in a run folder, its tensors mapped, not read (torch's mmap); Refused if it cannot resume."""
    import torch

    try:
        payload = torch.load(folder / NAME, map_location="cpu", mmap=True, weights_only=True)
    except Exception as error:  # noqa: BLE001 - a truncated zip, a bad pickle, an unreadable file: damaged
        raise Refused(f"is damaged ({(str(error).strip().splitlines() or [type(error).__name__])[0]})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("members"), list) or "loop" not in payload:
        raise Refused("is damaged (not a peltbench checkpoint)")
    if payload.get("format") != FORMAT or payload.get("training") != training_code():
        raise Refused(f"was written by peltbench {payload.get('peltbench')} whose training code differs from this one's "
                      f"(digest {payload.get('training')}, now {training_code()})")
    return payload


def progress_of(folder: Path, label: str) -> str | None:
    """`resumable, epoch 12 of 50` when the run folder holds a checkpoint of run `label` that can resume it, else None
    (peltbench-missing)."""
    if not exists(folder):
        return None
    try:
        payload = read(folder)
    except Refused as why:
        return f"its checkpoint {why}: it starts over"
    member = next((m for m in payload["members"] if m.get("label") == label), None)
    if member is None or not member["progress"].get("training"):
        return None
    return f"resumable, {describe_progress(member['progress'])}"


def resumable(runs: list[tuple[Path, str, str]]) -> list[Resumed]:
    """The checkpoints that resume some of these runs (each its run folder, config hash and label), one per group: the
    newest generation any of its runs holds (a job killed while linking a new one leaves some runs the one before).
    A checkpoint that cannot resume its run is refused in one line and removed: the run starts over."""
    found: dict[str, Resumed] = {}
    for index, (folder, digest, label) in enumerate(runs):
        if not exists(folder):
            continue
        try:
            payload = read(folder)
            position = _position(payload, label, digest)
        except Refused as why:
            log.warning("%s %s: %s starts over", folder / NAME, why, label)
            remove(folder)
            continue
        group = found.get(payload["group"])
        if group is None or payload["generation"] > group.payload["generation"]:
            found[payload["group"]] = group = Resumed(payload, group.runs if group else {}, folder / NAME)
        group.runs[position] = index
    resumed = []
    for group in found.values():
        for position, index in list(group.runs.items()):
            if not group.members[position]["progress"]["training"]:  # stopped there (its record was not written)
                folder, _, label = runs[index]
                log.warning("%s: %s had stopped at that point: it starts over", group.where, label)
                del group.runs[position]
        if group.runs:
            resumed.append(group)
    return resumed


def _position(payload: dict, label: str, digest: str) -> int:
    for position, member in enumerate(payload["members"]):
        if member.get("label") == label:
            if member.get("config_hash") != digest:
                raise Refused(f"is of another config (config hash {member.get('config_hash')}, this run's {digest})")
            return position
    raise Refused("is of another group (it has no run of this folder)")
