"""Files in a run folder that several processes share: its lock, atomic writes, and what a killed writer leaves.

Every process that writes a record or a claim in a run folder (peltbench.record, peltbench.claim) does it under the
folder's lock, `.lock` (flock), and through a temporary file renamed into place. So under the lock no temporary file
is being written by anyone: any found there was left by a killed process and is removed.
Files are created with mode 0666 and the umask applied by the kernel, as any file the user makes (a results
directory shared by a group, umask 002, stays writable by the group); `tempfile.mkstemp` would give 0600, and so does
safetensors' `save_file`, which `write_with` corrects.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

LOCK_NAME = ".lock"
TEMPORARY_PREFIXES = (".result.", ".claim.", ".probe.", ".save.")  # + a random part + ".tmp"


def temporary_name(folder: Path, prefix: str) -> Path:
    return folder / f"{prefix}{secrets.token_hex(6)}.tmp"


def create(path: Path) -> int:
    """A new file, opened for writing, with the umask's mode; FileExistsError if `path` exists."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)


@contextmanager
def folder_lock(folder: Path) -> Iterator[bool]:
    """Hold `folder`'s lock; yields whether it is held (False where the file system cannot lock, e.g. NFS without
    a lock daemon, or a colleague's lock file we may not open: renames still keep every write whole)."""
    try:
        handle = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file: flock works on a read-only descriptor on local disks
        try:
            handle = os.open(folder / LOCK_NAME, os.O_RDONLY)
        except OSError:
            handle = None
    if handle is None:
        yield False
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            locked = True
        except OSError:
            locked = False
        yield locked
    finally:
        os.close(handle)  # releases the lock


def write_file(path: Path, text: str, prefix: str, exclusive: bool = False) -> None:
    """Write `text` to `path` whole: a temporary file beside it, flushed to disk, then renamed over `path`.

    exclusive: only if `path` does not exist (FileExistsError otherwise), decided atomically by link(2).
    """
    temporary = temporary_name(path.parent, prefix)
    try:
        with os.fdopen(create(temporary), "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if exclusive:
            os.link(temporary, path)
            temporary.unlink()
        else:
            os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_with(path: Path, write: Callable[[Path], None], prefix: str) -> None:
    """Write `path` whole through `write(temporary)`, a library that writes a file by name (safetensors, csv): a
    temporary file beside `path`, given the umask's mode whatever mode the library left it (safetensors: 0600),
    flushed to disk, then renamed over `path`."""
    temporary = temporary_name(path.parent, prefix)
    try:
        os.close(create(temporary))
        mode = stat.S_IMODE(os.stat(temporary).st_mode)  # 0666 less the umask (and the folder's default ACL)
        write(temporary)
        os.chmod(temporary, mode)
        handle = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files of writers that were killed; call it holding `folder_lock(folder)`."""
    removed = []
    for entry in folder.glob(".*.tmp"):
        if entry.name.startswith(TEMPORARY_PREFIXES):
            try:
                entry.unlink()
                removed.append(entry)
            except OSError:  # a colleague's file in a folder we may not change: harmless, it is never read
                pass
    return removed
