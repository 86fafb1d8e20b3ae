"""Mid-run checkpoints: a group in training (a separate run is a group of one) saved whole, so that the same command
run again, or its requeued SLURM job, goes on from it and writes the records an uninterrupted run writes.

    checkpoint = Checkpointer(members, folders, every_minutes, extra, resume)   # runner._train_group
    fit(..., checkpoint=checkpoint)   # train.Training calls due() and save() at step boundaries
    checkpoint.leave(folder)          # a run's record is written: its checkpoint goes

The file is `checkpoint.pt` in the folder of each run of the group that still trains (beside its record to be), one
file hard-linked into each (a copy where the file system has no hard links): the whole group at one step boundary
(train.Training.state: trained tensors, optimiser, early stopping, data order, random generators, AdaLoRA's budget,
the period in progress, every member's history) with what the runner keeps per run (its loggers' state, when it
started), and a header: the group's members (label, config hash, config, how far each is), the torch and
transformers versions and a digest of each training-code file (`training_code`), a generation number. It is written
as a temporary file, then renamed over the last one (so never read half written), and the group's members keep their
own link until their record is written.

The file is torch.save's zip archive, which stores a CRC-32 of each record (the header's pickle, each tensor's bytes)
as it writes it; peltbench has torch compute them whatever its settings, and a checkpoint is resumed only after every
record is read back against its CRC-32 (`_damage`): a flipped bit or a cut in any tensor refuses it.

A checkpoint resumes only the group it was written for, as that group: members whose records exist by now (they
finished after it was written) or that this job does not run train along again to keep the others' numbers, and
write nothing; members that had stopped before it (early stopping, halving) stay stopped. It is refused, in one line
saying why, and its run starts over, when it is damaged, not a peltbench checkpoint, of another config, of another
format (one an earlier peltbench wrote), or written with another torch or transformers or another copy of the
training code (naming its files).

Imports torch only where a file is read or written: peltbench.missing reads a header with it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
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
FORMAT = 2  # 2: the header names the torch and transformers versions and each training-code file's digest
# The modules whose code decides what training computes: a checkpoint from a peltbench whose copies of them differ is
# refused (another version may train otherwise). Paths under peltbench/; a folder stands for its .py files.
# component.py decides the order in which components are wired into the model.
TRAINING_CODE = ("train.py", "runner.py", "data.py", "model.py", "architectures.py", "metrics.py", "tasks.py",
                 "protocols.py", "halving.py", "allocator.py", "checkpoint.py", "component.py", "methods")
LIBRARIES = ("torch", "transformers")  # whose versions a checkpoint names: another release may compute otherwise
CHUNK = 1 << 24  # bytes read at a time when a checkpoint is checked against its CRC-32s

_progressed = False  # this process has trained since it started (peltbench_slurm: max_num_timeout counts progress)


class Refused(Exception):
    """A checkpoint that cannot resume its run (the message says why)."""


@lru_cache(maxsize=1)
def training_code() -> dict:
    """What a checkpoint's training must have been: the libraries' versions (LIBRARIES) and a digest of each file of
    the training code (TRAINING_CODE), by its path under peltbench/."""
    import torch
    import transformers

    root = Path(__file__).resolve().parent
    code = {}
    for name in TRAINING_CODE:
        path = root / name
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            code[source.relative_to(root).as_posix()] = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    return {"torch": str(torch.__version__), "transformers": str(transformers.__version__), "code": code}


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
        """`epoch 12 of 50` (the furthest member still training), for the log."""
        return _furthest([member["progress"] for member in self.members])

    def stopped(self, position: int) -> bool:
        """Whether member `position` had stopped training before the checkpoint (its epochs done, early stopping,
        halving's pruning)."""
        return not self.members[position]["progress"]["training"]


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
            "format": FORMAT, "peltbench": __version__, "training": training_code(), "group": self.group,
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
        log.info("checkpoint: %s written in %.1fs (%s, %d run folder%s)", _furthest(progress["members"]),
                 time.perf_counter() - started, _size(size), len(folders), "" if len(folders) == 1 else "s")


def _furthest(members: list[dict]) -> str:
    """How far the furthest member still training is (of all, where none is), each member's progress given."""
    training = [member for member in members if member["training"]]
    return describe_progress(max(training or members, key=lambda member: member["done"]))


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
    crc32 = getattr(torch.serialization, "get_crc32_options", lambda: True)()  # torch < 2.6 always computes them
    try:
        with os.fdopen(create(temporary), "wb") as out:
            if not crc32:  # the user's torch settings turned them off: the check on read needs them
                torch.serialization.set_crc32_options(True)
            try:
                torch.save(payload, out)
            finally:
                if not crc32:
                    torch.serialization.set_crc32_options(False)
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


def read(folder: Path, whole: bool = True) -> dict:
    """The checkpoint in a run folder, its tensors mapped, not read (torch's mmap); Refused if it cannot resume.
    `whole`: every record checked against its CRC-32 first (reads the file once); else its header's only (cheap)."""
    import torch

    path = folder / NAME
    why = _damage(path, whole)
    if why:
        raise Refused(why)
    try:
        payload = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError:  # weights_only refuses what peltbench never writes: objects of classes
        raise Refused("is not a peltbench checkpoint (a torch file holding objects, not tensors and plain values)") \
            from None
    except Exception as error:  # noqa: BLE001 - anything else torch cannot make of a whole zip archive
        raise Refused(f"is not a peltbench checkpoint (torch cannot load it: {_first_line(error)})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("format"), int) \
            or not isinstance(payload.get("peltbench"), str):
        raise Refused("is not a peltbench checkpoint (a file torch.save wrote, without peltbench's header)")
    written = f"was written by peltbench {payload['peltbench']}"
    if payload["format"] != FORMAT:
        raise Refused(f"{written} in checkpoint format {payload['format']}; this peltbench reads format {FORMAT}")
    if not isinstance(payload.get("members"), list) or "loop" not in payload:
        raise Refused("is damaged (its header lacks the group's members or state)")
    differs = _differs(payload.get("training"), training_code())
    if differs:
        raise Refused(f"{written} {differs}, which may train otherwise")
    return payload


def _damage(path: Path, whole: bool) -> str | None:
    """Why the file at `path` is not a checkpoint as written (None: it is): not a zip archive (cut short, or something
    else), or a record whose bytes fail the CRC-32 torch.save stored with it (only the header's unless `whole`)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            for record in archive.infolist():
                if whole or record.filename.endswith("/data.pkl"):
                    with archive.open(record) as data:  # zipfile checks the CRC-32 when it reaches the end
                        while data.read(CHUNK):
                            pass
    except zipfile.BadZipFile as error:
        bad = re.match(r"Bad CRC-32 for file '[^/']*/?(.*)'", str(error))
        if bad:
            return f"is damaged (its record {bad[1]} is not what was written: its CRC-32 differs)"
        if _starts_as_zip(path):
            return f"is damaged (cut short, or its zip directory is: {error})"
        return "is not a peltbench checkpoint (not the zip archive torch.save writes): damaged, or another file"
    except (OSError, EOFError, ValueError) as error:  # unreadable, a zip cut short inside a record, a bad zip64 entry
        return f"is damaged ({_first_line(error)})"
    return None


def _starts_as_zip(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _differs(written, now: dict) -> str | None:
    """What differs between the training a checkpoint's header names (`training`) and this one's: a library's version,
    else the training-code files (None: nothing)."""
    if not isinstance(written, dict) or not isinstance(written.get("code"), dict):
        return "without the versions of its training code"
    for library in LIBRARIES:
        if written.get(library) != now[library]:
            return f"with {library} {written.get(library)}, and this is {library} {now[library]}"
    files = sorted(name for name in written["code"].keys() | now["code"].keys()
                   if written["code"].get(name) != now["code"].get(name))
    if not files:
        return None
    more = f" and {len(files) - 3} more" if len(files) > 3 else ""
    return f"whose training code differs from this one's in {', '.join(files[:3])}{more}"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def progress_of(folder: Path, label: str) -> str | None:
    """`resumable, epoch 12 of 50` when the run folder holds a checkpoint of run `label` that can resume it, else None
    (peltbench-missing)."""
    if not exists(folder):
        return None
    try:
        payload = read(folder, whole=False)  # the header only: the tensors are checked when the run resumes
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
    checked: set[tuple[int, int]] = set()  # the files checked whole: the group's runs share one (hard links)
    for index, (folder, digest, label) in enumerate(runs):
        try:
            file = os.stat(folder / NAME)
        except OSError:  # none
            continue
        try:
            payload = read(folder, whole=(file.st_dev, file.st_ino) not in checked)
            checked.add((file.st_dev, file.st_ino))
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
            if group.stopped(position):  # stopped there (its record was not written)
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
