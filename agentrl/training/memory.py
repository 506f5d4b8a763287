"""Resident memory of this process: measure it, bound what grows, return what is free.

What grows in a default run (``bench/memory_growth.py``): PyTorch's CPU bf16 matmuls go through
oneDNN, and both oneDNN's primitive cache and ideep's operator cache keep one entry (0.5-2 MB of
live heap for SmolLM2's matmuls) per distinct op shape, up to 1024 entries each. Rollout and
update shapes change every step (prompt, completion and micro-batch lengths), so the live heap
grows by ~25-35 MB a step until both caches fill (GBs). :func:`limit_kernel_caches` caps them.

What does not grow but is large: a step's freed activations, logits and gradients (~2 GB) stay in
glibc's heaps as free space the next step reuses. :func:`release_free_memory` (``malloc_trim``)
hands it back, lowering the RSS between steps but not the peak within one, and the next step
faults it back in (~1 s of CPU per 2 GB in a micro-benchmark): worth it after one-off work (an evaluation, a
checkpoint), not after every step. Off glibc Linux the malloc functions are no-ops.

What glibc does not keep: a block above its mmap threshold (32 MiB at most) is mapped on its own
and unmapped when freed, and the next one is faulted in again page by page. A training step makes
several such blocks per micro-batch on the default model in fp32 (the head's logits and their
gradient, ~50 MB each; the head weight's gradient, 113 MB): :func:`keep_large_blocks` serves them
from the heap instead and keeps up to a budget of freed heap for the next ones (the default job's
steps 0.84x the time in fp32, 0.73x in bf16 on a 2-core CPU: ``bench/large_blocks.py``); the RSS
then stays near its peak between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys
from dataclasses import dataclass
from functools import cache

from agentrl.errors import ConfigError

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_gb() -> float:
    """This process's current resident memory in GB (10**9 bytes); NaN where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        import psutil

        return psutil.Process().memory_info().rss / 1e9
    except Exception:  # psutil missing, or no permission
        return float("nan")


def peak_rss_gb() -> float:
    """This process's peak resident memory so far in GB: on Linux the kernel's high-water mark of
    this program (``VmHWM``; ``ru_maxrss`` would carry over the peak of the process an exec
    replaced, e.g. a big notebook that started the run), elsewhere ``ru_maxrss`` (bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9  # KiB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (musl and others lack ``malloc_trim``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError off glibc
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc ``malloc_trim(0)``, every arena).

    Takes ~0.1 s per 2 GB free; what is reused afterwards is faulted back in. Returns whether
    anything was released (False also where this is not glibc)."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (glibc's malloc.h)
MALLOC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
"""glibc's own environment variables for these settings: where one is set, it is left to decide."""
KEEP_VARIABLE = "AGENTRL_KEEP_LARGE_BLOCKS"
"""``0``: leave glibc's defaults as they are (``1``, or unset: keep large blocks)."""


def keep_large_blocks(keep_gb: float = 1.0) -> bool:
    """Serve every block from glibc's heap (no block mapped on its own: ``M_MMAP_MAX`` 0) and keep
    up to ``keep_gb`` of freed memory at the heap's top (``M_TRIM_THRESHOLD``, at most 2 GiB) for the
    next allocations, for the rest of the process. Returns whether it was set: not off glibc Linux,
    nor with ``AGENTRL_KEEP_LARGE_BLOCKS=0``, nor where the environment sets one of
    :data:`MALLOC_VARIABLES` (the user's choice stands)."""
    asked = os.environ.get(KEEP_VARIABLE, "1")
    if asked not in ("0", "1"):
        raise ConfigError(f"{KEEP_VARIABLE}={asked!r}: allowed are 0 (glibc's defaults) and 1 (keep large blocks)")
    libc = _libc()
    if asked == "0" or libc is None or any(name in os.environ for name in MALLOC_VARIABLES):
        return False
    threshold = min(int(keep_gb * 2**30), 2**31 - 1)
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, threshold))


KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
"""oneDNN's primitive cache and ideep's (PyTorch's oneDNN wrapper) LRU cache of operators: 1024
entries each by default, one per distinct op shape, about 1 MB each for bf16 matmuls."""


def limit_kernel_caches(capacity: int = 256) -> dict[str, str]:
    """Cap the CPU kernel caches (:data:`KERNEL_CACHE_VARIABLES`) at ``capacity`` entries each,
    unless the environment already sets them; returns the values in force.

    Both caches read their variable at their first use, so call this before the first bf16
    matmul of the process (a later call changes nothing). 256 keeps the sampling speed of the
    default (64 measured ~5-10% slower); ``capacity`` must be >= 1: ``LRU_CACHE_CAPACITY=0``
    crashes PyTorch 2.13."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    return {name: os.environ.setdefault(name, str(capacity)) for name in KERNEL_CACHE_VARIABLES}


@dataclass(frozen=True)
class MallocStats:
    """glibc ``mallinfo2()`` over all arenas, in GB."""

    heap_gb: float
    """Heap space malloc got from the OS (``arena``: sbrk heap + thread arenas' heaps)."""
    mmapped_gb: float
    """Blocks mapped on their own (``hblkhd``)."""
    in_use_gb: float
    """Heap bytes in live allocations (``uordblks``)."""
    free_gb: float
    """Heap bytes freed but kept by malloc (``fordblks``): fragmentation or trimmable slack."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_stats() -> MallocStats | None:
    """glibc's allocator totals now (None off glibc or before glibc 2.33, which lacks ``mallinfo2``)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return MallocStats(
        heap_gb=info.arena / 1e9,
        mmapped_gb=info.hblkhd / 1e9,
        in_use_gb=info.uordblks / 1e9,
        free_gb=info.fordblks / 1e9,
    )
