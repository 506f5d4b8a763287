"""Run untrusted Python code (a model's tool call) in a subprocess, never in the trainer.

``run_python(code)`` starts ``sys.executable -I -S -B`` (isolated mode: no ``PYTHON*`` variables,
no user or system site-packages, so only the standard library; no ``.pyc`` files) in a fresh
scratch directory, with an explicit minimal environment (``PATH``, ``HOME`` and ``TMPDIR`` set to
the scratch directory, ``PYTHONDONTWRITEBYTECODE``; nothing inherited, so no secrets). A small
bootstrap in the child applies the limits before the code runs, so the trainer never calls the
thread-unsafe ``preexec_fn``.

What every call gets, on any Linux:

* a wall-clock limit: on timeout the child's whole process group (``start_new_session``) is
  killed with SIGKILL, and after every call the group is killed too, so background children die;
* ``RLIMIT_AS`` (``memory_mb`` per process: a huge allocation is a ``MemoryError`` in the child),
  ``RLIMIT_FSIZE`` (``disk_mb`` per file), ``RLIMIT_CPU`` (a backstop if the trainer dies),
  no core dumps; stdout and stderr read incrementally and capped at ``max_output_chars`` each.

What it adds where it can (``SandboxResult.isolation`` names the layers that were applied):

* ``"uid"`` (trainer runs as root): the code runs as a fresh unprivileged uid/gid with no
  supplementary groups, so Unix permissions stop it from changing root's files or reading
  ``/proc/<trainer>/environ``; ``RLIMIT_NPROC`` (``max_processes``) then guards against fork
  bombs (root ignores it), and after the call every process of that uid is killed, including
  ones that left the process group with ``setsid``. Root keeps the code as root only where the
  Python installation is closed to other users and ``"fs"`` is unavailable: then no fork guard.
  Not running as root, the code runs as the trainer's user (it can read and write whatever the
  trainer can, its environment included); ``RLIMIT_NPROC`` is ``max_processes`` more than the
  user already runs (or ``max_processes`` in a new user namespace, which counts its own).
* ``"fs"`` (root, mount namespaces allowed): a private mount namespace in which ``/tmp``,
  ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` (the usual world-writable places) are fresh
  private tmpfs, so nothing the code writes there outlives it; the scratch directory is a
  private tmpfs of ``disk_mb``; directories the unprivileged uid cannot enter (``/root``) are
  replaced by empty ones with only the Python installation bound in, read-only. Without it, a
  uid-dropped child can still create files in world-writable directories.
* ``"net"``: a private network namespace (no interfaces up, not even loopback), via
  ``unshare(CLONE_NEWNET)``, or unprivileged with a user namespace. Without it the code has
  whatever network the trainer has.

Not given: a limit on total memory across the ``max_processes`` processes (use cgroups), CPU
shares, or protection from kernel exploits. Run untrusted code in a VM or container for that.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.errors import EnvError

_UID_BASE, _UID_SPAN = 1_500_000_000, 500_000_000
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_GRACE_S = 0.5  # after the main process exits, how long to wait for children holding its pipes

# Runs in the child as ``python -I -S -B -c _BOOTSTRAP CONFIG``, before any untrusted code.
_BOOTSTRAP = r"""
import ctypes, json, os, resource, signal, sys, traceback
cfg = json.loads(sys.argv[1])
done, uid = [], cfg["uid"]
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: s.encode() if s else None
    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount " + dst)
def report(**extra):
    os.write(cfg["status_fd"], json.dumps(dict(isolation=done, **extra)).encode())
    os.close(cfg["status_fd"])
with open(cfg["code_path"], encoding="utf-8") as f:
    code = f.read()
scratch = cfg["scratch"]
mine = 0  # RLIMIT_NPROC counts every process and thread of the real uid
if uid is None and os.getuid() != 0:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(l.split(":", 1) for l in open("/proc/%s/status" % pid) if ":" in l)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == os.getuid():
            mine += int(status.get("Threads", "1"))
if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
    done.append("net")
elif uid is None and libc.unshare(0x50000000) == 0:  # CLONE_NEWUSER | CLONE_NEWNET
    done.append("net")
    if tuple(map(int, os.uname().release.split(".")[:2])) >= (5, 14):
        mine = 0  # since Linux 5.14 a new user namespace counts its own processes only
changed = False
if uid is not None and libc.unshare(0x00020000) == 0:  # CLONE_NEWNS
    try:
        mount(None, "/", None, 0x4000 | 0x40000)  # MS_REC | MS_PRIVATE: nothing leaks out
        binds = [(p, os.open(p, os.O_PATH)) for p in cfg["binds"]]
        changed = True
        for d in cfg["hide"]:
            mode = "1777,size=16m" if d in cfg["world_writable"] else "755,size=1m"
            mount("tmpfs", d, "tmpfs", 2 | 4, "mode=" + mode)  # MS_NOSUID | MS_NODEV
        for p, fd in binds:
            os.makedirs(p, exist_ok=True)
            mount("/proc/self/fd/%d" % fd, p, None, 0x1000 | 0x4000)  # MS_BIND | MS_REC
            mount(None, p, None, 0x1000 | 0x20 | 1)  # MS_BIND | MS_REMOUNT | MS_RDONLY
            os.close(fd)
        os.makedirs(scratch, exist_ok=True)
        mount("tmpfs", scratch, "tmpfs", 2 | 4,
              "mode=700,uid=%d,gid=%d,size=%dm" % (uid, uid, cfg["disk_mb"]))
        done.append("fs")
    except OSError as exc:
        if changed:  # half-built view: refuse to run rather than run without it
            report(error="could not set up the private mount namespace: %s" % exc)
            sys.exit(70)
os.chdir(scratch)
with open("main.py", "w", encoding="utf-8") as f:
    f.write(code)
def limit(res, n):  # never above the hard limit we inherited (only root may raise it)
    hard = resource.getrlimit(res)[1]
    n = n if hard == resource.RLIM_INFINITY else min(n, hard)
    resource.setrlimit(res, (n, n))
limit(resource.RLIMIT_AS, cfg["memory_bytes"])
limit(resource.RLIMIT_FSIZE, cfg["disk_mb"] << 20)
limit(resource.RLIMIT_CPU, cfg["cpu_s"])
limit(resource.RLIMIT_CORE, 0)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-big file is an OSError, not a kill
if uid is not None and (not cfg["hide_needed"] or "fs" in done):
    os.chown("main.py", uid, uid)
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
    done.append("uid")
limit(resource.RLIMIT_NPROC, cfg["max_processes"] + mine)
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the trainer (after setuid, which clears it)
report()
import builtins
builtins.exit = builtins.quit = sys.exit
sys.argv = ["main.py"]
del ctypes, json, resource, signal, cfg, libc, mount, report, limit, f
try:
    exec(compile(code, "main.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
except SystemExit:
    raise
except BaseException as exc:
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""


@dataclass(frozen=True)
class SandboxResult:
    """What one ``run_python`` call produced."""

    stdout: str
    """Standard output, capped at ``max_output_chars`` (a marker says how much was cut)."""
    stderr: str
    """Standard error (tracebacks), capped the same way."""
    exit_code: int | None
    """The process's exit status; negative: killed by that signal."""
    timed_out: bool
    """True if the wall-clock limit killed it."""
    error: str | None = None
    """Why the sandbox stopped the code (timeout, memory, a signal, setup), else None."""
    isolation: tuple[str, ...] = field(default=())
    """The optional layers that were applied: any of ``"uid"``, ``"fs"``, ``"net"``."""


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512,
               max_output_chars: int = 4000, max_processes: int = 16, disk_mb: int = 64
               ) -> SandboxResult:
    """Run ``code`` as a Python script in a sandboxed subprocess (see the module docstring)."""
    if not isinstance(code, str):
        raise EnvError(f"run_python: code must be a str, got {type(code).__name__}")
    for name, value, low in (("timeout_s", timeout_s, 0.01), ("memory_mb", memory_mb, 64),
                             ("max_output_chars", max_output_chars, 1),
                             ("max_processes", max_processes, 1), ("disk_mb", disk_mb, 1)):
        if not value >= low:
            raise EnvError(f"run_python: {name} must be at least {low}, got {value!r}")
    blocked = _python_binds() if os.geteuid() == 0 else None
    uid = _pick_uid() if blocked is not None else None
    scratch = tempfile.mkdtemp(prefix="agentrl-sandbox-")
    status_r, status_w = os.pipe()
    try:
        code_path = os.path.join(scratch, "main.py")
        Path(code_path).write_text(code, encoding="utf-8")
        if uid is not None:
            os.chown(scratch, uid, uid)
        config = {
            "uid": uid, "scratch": scratch, "code_path": code_path, "status_fd": status_w,
            "memory_bytes": int(memory_mb) << 20, "disk_mb": int(disk_mb),
            "cpu_s": int(timeout_s) + 2, "max_processes": int(max_processes),
            "hide": [d for d in _WORLD_WRITABLE if os.path.isdir(d)] + [b for b, _ in blocked or ()],
            "world_writable": list(_WORLD_WRITABLE), "hide_needed": bool(blocked),
            "binds": [p for _, paths in blocked or () for p in paths],
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
               "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP, json.dumps(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=scratch, env=env, pass_fds=(status_w,), start_new_session=True, close_fds=True)
        os.close(status_w)
        status_w = -1
        try:
            (out, err), timed_out = _collect(proc, timeout_s, max_output_chars * 4)
        finally:
            _kill_everything(proc, uid)
        status = _read_status(status_r)
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)
    stdout, stderr = _cap(out, max_output_chars), _cap(err, max_output_chars)
    error = _explain(proc.returncode, timed_out, stderr, status, timeout_s, memory_mb)
    return SandboxResult(stdout, stderr, proc.returncode, timed_out, error,
                         tuple(status.get("isolation", ())))


def _pick_uid() -> int:
    """A fresh uid for this call, or ``nobody`` where the user namespace maps too few uids."""
    try:
        for line in Path("/proc/self/uid_map").read_text().splitlines():
            inside, _, count = (int(x) for x in line.split())
            if inside <= _UID_BASE and _UID_BASE + _UID_SPAN <= inside + count:
                return _UID_BASE + secrets.randbelow(_UID_SPAN)
    except (OSError, ValueError):
        pass
    return 65534


@functools.lru_cache(maxsize=1)
def _python_binds() -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """What a uid-dropped child needs bound in to reach the Python installation.

    ((top-most directory others cannot enter, (installation paths inside it to bind)), ...);
    None where no bind can help (the installation itself is closed to others).
    """
    needed = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix)}
    needed.add(os.path.dirname(os.path.realpath(sys.executable)))
    blocked: dict[str, list[str]] = {}
    for path in sorted(needed):
        if os.stat(path).st_mode & 0o005 != 0o005:
            return None
        parts = Path(path).parts
        for ancestor in (os.path.join(*parts[:i]) for i in range(2, len(parts))):
            if not os.stat(ancestor).st_mode & 0o001:
                kept = blocked.setdefault(ancestor, [])
                if not any(path.startswith(k + os.sep) for k in kept):
                    kept.append(path)
                break
    return tuple((ancestor, tuple(paths)) for ancestor, paths in blocked.items())


def _collect(proc: subprocess.Popen, timeout_s: float, cap: int
             ) -> tuple[tuple[tuple[bytes, int], ...], bool]:
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
            if exited_at is not None and now - exited_at > _GRACE_S:
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


def _kept(kept: dict[int, bytearray], totals: dict[int, int], fds: list[int]
          ) -> tuple[tuple[bytes, int], ...]:
    """(kept bytes, total bytes) of stdout and stderr."""
    return tuple((bytes(kept[fd]), totals[fd]) for fd in fds)


def _cap(captured: tuple[bytes, int], max_chars: int) -> str:
    """Decode captured output and cut it to ``max_chars`` characters with a marker."""
    data, total = captured
    text = data.decode("utf-8", errors="replace")
    if len(text) > max_chars or total > len(data):
        return text[:max_chars] + (f"\n[output truncated: {total} bytes in all, "
                                   f"first {max_chars} characters shown]")
    return text


def _kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """SIGKILL the child's process group and, for a fresh uid, every process of that uid."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None and uid != 65534:
        killer = f"import os; os.setgroups([]); os.setgid({uid}); os.setuid({uid}); os.kill(-1, 9)"
        subprocess.run([sys.executable, "-I", "-S", "-c", killer], env={},
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _read_status(fd: int) -> dict:
    """The bootstrap's report of what it applied (empty if it died before writing it)."""
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}


def _explain(code: int | None, timed_out: bool, stderr: str, status: dict, timeout_s: float,
             memory_mb: int) -> str | None:
    """One line saying why the sandbox stopped the code, or None if it ran its course."""
    if status.get("error"):
        return f"sandbox setup failed: {status['error']}"
    if timed_out:
        return f"timed out after {timeout_s:g} s; the process group was killed"
    if not status:
        return (f"sandbox setup failed: the sandbox stopped before running the code "
                f"(exit code {code}); see stderr")
    if stderr.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
        return f"memory limit exceeded ({memory_mb} MB per process)"
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        reason = {"SIGXCPU": " (CPU time limit)", "SIGKILL": " (out of memory or killed)"}
        return f"killed by signal {name}{reason.get(name, '')}"
    return None
