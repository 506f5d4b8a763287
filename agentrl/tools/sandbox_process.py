"""The trainer's side of a sandboxed child process (:func:`agentrl.tools.sandbox.run_python`):
its stdout and stderr read as they come until the deadline, each capped; everything it started
killed after the call; the bootstrap's status report read back."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

GRACE_S = 0.5
"""After the main process exits, how long to wait for children holding its pipes."""


def collect_output(proc: subprocess.Popen, timeout_s: float, cap: int) -> tuple[tuple[tuple[bytes, int], ...], bool]:
    """Read stdout and stderr until EOF or the deadline: ((first ``cap`` bytes, total) of each,
    timed out)."""
    fds = [pipe.fileno() for pipe in (proc.stdout, proc.stderr) if pipe is not None]
    kept = {fd: bytearray() for fd in fds}
    totals = dict.fromkeys(fds, 0)
    deadline = time.monotonic() + timeout_s
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for fd in fds:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is None and now >= deadline:
                return _kept(kept, totals, fds), True
            if exited_at is not None and now - exited_at > GRACE_S:
                break
            for key, _ in selector.select(min(deadline - now, 0.05)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                totals[key.fd] += len(chunk)
                kept[key.fd] += chunk[: max(0, cap - len(kept[key.fd]))]
    try:  # both pipes closed: wait for the exit itself, within the deadline
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return _kept(kept, totals, fds), True
    return _kept(kept, totals, fds), False


def _kept(kept: dict[int, bytearray], totals: dict[int, int], fds: list[int]) -> tuple[tuple[bytes, int], ...]:
    """(kept bytes, total bytes) of stdout and stderr."""
    return tuple((bytes(kept[fd]), totals[fd]) for fd in fds)


def cap_output(captured: tuple[bytes, int], max_chars: int) -> str:
    """Decode captured output and cut it to ``max_chars`` characters with a marker."""
    data, total = captured
    text = data.decode("utf-8", errors="replace")
    if len(text) > max_chars or total > len(data):
        return text[:max_chars] + (f"\n[output truncated: {total} bytes in all, first {max_chars} characters shown]")
    return text


def kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """SIGKILL the child's process group and, for a fresh uid, every process of that uid."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None and uid != 65534:
        killer = f"import os; os.setgroups([]); os.setgid({uid}); os.setuid({uid}); os.kill(-1, 9)"
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", killer],
            env={},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def read_status(fd: int) -> dict:
    """The bootstrap's report of what it applied, one JSON object a line, merged (empty if it
    died before writing one)."""
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    status: dict = {}
    for line in b"".join(chunks).splitlines():
        try:
            status.update(json.loads(line))
        except ValueError:
            pass
    return status
