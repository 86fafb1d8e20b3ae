"""The CPU allocator while a group trains: freed memory is kept for the next step, not handed back to the system.

On Linux, glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh `mmap` and
returns it with `munmap` when freed. A fused group's activations are the members' batches side by side: 36 MiniLM
members at batch 16 make a hidden state of ~60 MB and an FFN intermediate of ~240 MB, so every such tensor of every
step is mapped anew and its pages are faulted in and zeroed by the kernel (0.3-1.9 million minor page faults a step,
seconds of system time), while a separate run's tensors stay under the threshold and are reused from the heap.
Measured on the project's CPU: a 58 MB `zeros_like` takes 51 ms freshly mapped, 6 ms from the heap
(docs/fused.md). So while a group trains on the CPU, `kept_memory` turns mmap off (`M_MMAP_MAX` = 0: big blocks
come from the heap too) and the heap's top is not trimmed (`M_TRIM_THRESHOLD`): the process keeps its peak for the
next step, as CUDA's caching allocator does. Afterwards the defaults come back and `malloc_trim` hands the free
memory back, so the process does not hold a group's peak for the rest of a sweep. Elsewhere (macOS, musl, Windows)
it does nothing. Only speed changes: the same tensors hold the same values.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from contextlib import contextmanager
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4                         # mallopt's parameters (malloc.h)
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536  # glibc's defaults
KEEP = 2**31 - 1                                              # trim only beyond 2 GiB of free memory at the top


@lru_cache(maxsize=1)
def _glibc():
    """glibc's C library, or None (another platform or C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


@contextmanager
def kept_memory(device):
    """While inside, on a CPU with glibc: freed memory stays in the heap for reuse (see the module's docstring)."""
    libc = _glibc() if getattr(device, "type", str(device)) == "cpu" else None
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, KEEP)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        libc.malloc_trim(0)
