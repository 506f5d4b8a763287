"""agentrl.training.memory measures the process's real memory, and release_free_memory returns freed heap."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.model.precision import cpu_flags, decide_cpu
from agentrl.training import memory

MB = 1e6
glibc_only = pytest.mark.skipif(memory.malloc_stats() is None, reason="needs glibc (mallinfo2, malloc_trim)")


def test_rss_follows_a_buffer_allocated_and_freed() -> None:
    before = memory.rss_gb()
    # mapped by hand: malloc may keep a freed block (a trainer built in this process keeps large ones)
    buffer = mmap.mmap(-1, 300_000_000)
    buffer.write(b"\x01" * 300_000_000)  # written, so resident
    during = memory.rss_gb()
    buffer.close()
    after = memory.rss_gb()
    assert during - before > 0.25, (before, during)
    assert during - after > 0.25, (during, after)


LOAD_MEMORY = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("agentrl_memory", sys.argv[1])
memory = importlib.util.module_from_spec(spec)
sys.modules["agentrl_memory"] = memory
spec.loader.exec_module(memory)
"""
"""The start of a probe run as ``python -c PROBE path/to/memory.py ...``: this module loaded alone,
in a fresh interpreter, as ``memory``."""


def _probe_lines(probe: str, *args: str, env: dict[str, str]) -> list[str]:
    """The lines a probe printed, run in a fresh interpreter with ``env`` as its environment."""
    command = [sys.executable, "-c", probe, str(Path(memory.__file__)), *args]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=True)
    return out.stdout.strip().splitlines()


# Measured in a child forked by the probe: Linux carries the peak of the process an exec replaced
# over to the new program (an exec'd interpreter starts with the test worker's peak, GBs once a real
# model was loaded, and the buffer beyond it took ~30 s to fault in), while a forked child starts
# with a peak of its own (the probe's few MB).
PEAK_PROBE = (
    LOAD_MEMORY
    + """
import json, os
pid = os.fork()
if pid:
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
buffer = b"\\x01" * int(memory.peak_rss_gb() * 1e9 + 200e6)  # beyond every earlier peak
current = memory.rss_gb()
del buffer
print(json.dumps({"current": current, "peak": memory.peak_rss_gb(), "after": memory.rss_gb()}))
"""
)


def test_peak_rss_is_at_least_current_and_remembers_a_freed_buffer() -> None:
    """In a fresh process (PEAK_PROBE): a test worker's own peak can be GBs (a real model loaded by
    an earlier test), and a buffer beyond it took ~30 s to fault in."""
    out = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, str(Path(memory.__file__))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["peak"] >= seen["current"] * 0.99, seen  # same unit (GB) as rss_gb
    assert seen["peak"] - seen["after"] > 0.15, f"the freed buffer is no longer resident but stays in the peak: {seen}"


# A program started by a process that peaked high: its own peak is its own (an exec'd interpreter
# of a few tens of MB), not the parent's 400 MB+.
EXEC_PROBE = """
import subprocess, sys
buffer = b"\\x01" * 400_000_000
del buffer
code = (
    "import importlib.util, sys; spec = importlib.util.spec_from_file_location('m', sys.argv[1]); "
    "m = sys.modules['m'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(m.peak_rss_gb())"
)
print(subprocess.run([sys.executable, "-c", code, sys.argv[1]], capture_output=True, text=True, check=True).stdout)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux carries ru_maxrss over an exec")
def test_a_program_started_by_a_process_that_peaked_high_reports_its_own_peak() -> None:
    out = subprocess.run(
        [sys.executable, "-c", EXEC_PROBE, str(Path(memory.__file__))], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert 0 < float(out.stdout.strip()) < 0.2, out.stdout


@glibc_only
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")
def test_release_free_memory_returns_fragmented_heap_to_the_os() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 1000, 250_000  # 250 MB in small blocks: heap, not mmap
    blocks = [libc.malloc(size) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    kept = blocks[::16]  # one live block every 16 KB pins the heap: free() alone cannot shrink it
    for block in [b for i, b in enumerate(blocks) if i % 16]:
        libc.free(block)
    try:
        stats = memory.malloc_stats()
        assert stats is not None and stats.free_gb > 0.2, stats  # freed, yet kept by malloc
        before = memory.rss_gb()
        assert memory.release_free_memory()
        after = memory.rss_gb()
        assert before - after > 0.1, f"malloc_trim released only {1000 * (before - after):.0f} MB"
    finally:
        for block in kept:
            libc.free(block)


KERNEL_CACHE_PROBE = (
    LOAD_MEMORY
    + """
if sys.argv[2] != "default":
    memory.limit_kernel_caches(int(sys.argv[2]))
import torch
weight = torch.randn(1536, 576, dtype=torch.bfloat16)
torch.nn.functional.linear(torch.randn(8, 576, dtype=torch.bfloat16), weight)
before = memory.malloc_stats().in_use_gb
for rows in range(16, 16 + 8 * 100, 8):  # 100 shapes, as the varying batch lengths of training
    torch.nn.functional.linear(torch.randn(rows, 576, dtype=torch.bfloat16), weight)
print(1000 * (memory.malloc_stats().in_use_gb - before))
"""
)


def _live_mb_after_100_shapes(capacity: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in memory.KERNEL_CACHE_VARIABLES}
    return float(_probe_lines(KERNEL_CACHE_PROBE, capacity, env=env)[-1])


@glibc_only
def test_limit_kernel_caches_stops_live_memory_growing_with_each_new_shape() -> None:
    import torch

    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    if not decide_cpu(cpu_flags()).bf16:  # measured: 0.0 MB for 100 shapes on an AVX2-only AMD EPYC
        pytest.skip("no native bf16 on this CPU: bf16 matmuls do not go through oneDNN's cached kernels")
    grown = _live_mb_after_100_shapes("default")
    limited = _live_mb_after_100_shapes("8")
    assert grown > 30, f"the default caches kept only {grown:.1f} MB for 100 shapes: nothing to limit?"
    assert limited < grown / 4, f"limited caches still grew {limited:.1f} MB (default {grown:.1f} MB)"


def test_limit_kernel_caches_keeps_what_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "512")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert memory.limit_kernel_caches(32) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "32", "LRU_CACHE_CAPACITY": "512"}
    with pytest.raises(ValueError):
        memory.limit_kernel_caches(0)


LARGE_BLOCK_PROBE = (
    LOAD_MEMORY
    + """
print(memory.keep_large_blocks())
import torch
before = memory.malloc_stats().mmapped_gb
block = torch.ones(64 * 2**20 // 4)  # 64 MiB, above glibc's largest mmap threshold
mapped = memory.malloc_stats().mmapped_gb - before
rss = memory.rss_gb()
del block  # as every micro-batch frees the head's gradient
print(mapped, rss - memory.rss_gb())
"""
)


def _large_block(env: dict[str, str]) -> tuple[str, float, float]:
    """Whether the probe kept large blocks, the GB its 64 MiB tensor mapped on its own and the
    resident GB freeing it gave back to the OS."""
    clean = {k: v for k, v in os.environ.items() if k not in (*memory.MALLOC_VARIABLES, memory.KEEP_VARIABLE)}
    kept, numbers = _probe_lines(LARGE_BLOCK_PROBE, env={**clean, **env})[-2:]
    mapped, released = numbers.split()
    return kept, float(mapped), float(released)


@glibc_only
def test_keep_large_blocks_serves_a_large_tensor_from_the_heap_and_keeps_it_when_freed() -> None:
    """glibc's default maps a 64 MiB tensor on its own and unmaps it when freed (the next one is
    faulted in again page by page); kept, it comes from the heap and stays there for the next."""
    kept, mapped, released = _large_block({})
    assert kept == "True" and mapped == 0.0 and released < 0.01, (kept, mapped, released)
    default, mapped, released = _large_block({memory.KEEP_VARIABLE: "0"})
    assert default == "False" and mapped > 0.06 and released > 0.06, (default, mapped, released)
    users, mapped, _ = _large_block({"MALLOC_MMAP_MAX_": "65536"})  # the user's own glibc setting stands
    assert users == "False" and mapped > 0.06


def test_keep_large_blocks_refuses_a_bad_setting_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memory.KEEP_VARIABLE, "yes")
    with pytest.raises(ConfigError, match=r"AGENTRL_KEEP_LARGE_BLOCKS='yes': allowed are 0 .* and 1"):
        memory.keep_large_blocks()
