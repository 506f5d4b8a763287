"""Run untrusted Python code (a model's tool call) in a subprocess, never in the trainer.

``run_python(code)`` starts ``sys.executable -I -S -B`` (no ``PYTHON*`` variables, no
site-packages: only the standard library; no ``.pyc`` files) in a fresh scratch directory with a
minimal environment (``PATH``; ``HOME`` and ``TMPDIR`` set to the scratch directory; nothing
inherited, so no secrets). A bootstrap in the child (``agentrl/tools/_sandbox_setup.py``, run by path)
applies the limits and layers below, then ``exec``s a fresh interpreter for the code
(``agentrl/tools/_sandbox_run.py``), so nothing it loaded (``ctypes``) is left there; the trainer never
calls the thread-unsafe ``preexec_fn``.

Every call gets a wall-clock limit (the child's process group, ``start_new_session``, is
SIGKILLed on timeout and after every call), ``RLIMIT_AS`` (``memory_mb`` per process: a huge
allocation is a ``MemoryError``), ``RLIMIT_FSIZE`` (``disk_mb`` per file), ``RLIMIT_CPU`` (a
backstop if the trainer dies), no core dumps, ``no_new_privs``, and stdout/stderr read as they
come, capped at ``max_output_chars`` each.

Layers added where this machine allows, strongest first (``SandboxResult.isolation`` names those
a call got; ``protections()`` says which threat each blocks here):

* ``"landlock"`` (Linux 5.13+, no privilege needed): the code reads only the system and Python
  directories (``/usr``, ``/lib*``, ``/bin``, ``/sbin``, ``/etc/ld.so.cache``, the installation),
  a few ``/dev`` files, its scratch directory and (with ``"pid"``) its own ``/proc``, and writes
  only in the scratch directory: ``/etc/passwd``, ``/home``, the repository, other processes'
  ``/proc/<pid>/cmdline`` give ``PermissionError``. ABI 4+: no TCP connect/bind; ABI 6+: no
  signals to processes outside the sandbox, no abstract Unix sockets.
* ``"seccomp"`` (x86_64, aarch64): ``setsid``/``setpgid`` fail, so nothing leaves the process
  group and the group kill reaches every process the code started; sockets other than
  ``AF_UNIX``, and ``io_uring``, fail: no network, DNS included.
* ``"pid"`` (root or unprivileged user namespaces): a PID namespace with its own ``/proc``: the
  code sees only its own processes and is their PID 1 (a signal it sends itself without a
  handler is ignored); when it exits, everything in it dies.
* ``"net"``: a network namespace with no interface up, not even loopback.
* ``"uid"`` (trainer runs as root): a fresh unprivileged uid/gid, no supplementary groups; then
  ``RLIMIT_NPROC`` (``max_processes``) bounds fork bombs and every process of that uid is killed
  after the call. Not root, ``RLIMIT_NPROC`` is ``max_processes`` more than the user runs (or
  ``max_processes`` in a new user namespace, which counts its own).
* ``"fs"`` (root, mount namespaces): private tmpfs on ``/tmp``, ``/var/tmp``, ``/dev/shm``,
  ``/run/lock`` and the scratch directory (``disk_mb``); directories the uid cannot enter
  (``/root``) emptied but for the Python installation, bound read-only.
* ``"audit"``, the fallback: an audit hook (PEP 578) in the code's interpreter refuses what a
  missing layer would have: without Landlock, opening or listing outside the readable
  directories, changing anything outside the scratch directory, importing ``ctypes`` or
  ``_posixsubprocess``, starting programs; without ``"net"`` or ``"seccomp"``, sockets other
  than ``AF_UNIX`` and name lookups; without ``"pid"``, ``"seccomp"`` or ``"uid"``, ``fork``.
  It is NOT a security boundary: it lives in the interpreter it guards, so a CPython bug or a
  ``dir_fd`` trick gets around it. It stops ordinary code, not a determined attacker.

Costs: about 40 ms more per call than a bare subprocess; with Landlock no ``multiprocessing``
(no ``/dev/shm``) and no local time zone (UTC). Not given: a limit on total memory across
processes (use cgroups), CPU shares, protection from kernel exploits: for those, run untrusted
code in a VM or container.
"""

from __future__ import annotations

import functools
import json
import numbers
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import EnvError
from agentrl.tools.sandbox_process import cap_output, collect_output, kill_everything, read_status
from agentrl.tools.tool import ToolError

_UID_BASE, _UID_SPAN = 1_500_000_000, 500_000_000
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DISABLED: frozenset[str] = frozenset()
"""Layers not to apply, to exercise the fallbacks (tests only)."""

_LIMITS: dict[str, tuple[type, float, float, str]] = {
    "timeout_s": (numbers.Real, 0.01, 3600, "a number of seconds"),
    "memory_mb": (numbers.Integral, 64, 1 << 20, "an integer number of MB"),
    "max_output_chars": (numbers.Integral, 1, 10**8, "an integer number of characters"),
    "max_processes": (numbers.Integral, 1, 4096, "an integer number of processes"),
    "disk_mb": (numbers.Integral, 1, 1 << 20, "an integer number of MB"),
}

THREATS: dict[str, tuple[str, ...]] = {  # "uid" alone leaves world-writable dirs writable
    "reading files outside the scratch directory": ("landlock", "audit"),
    "reading other processes' /proc/<pid>/cmdline": ("pid", "landlock", "audit"),
    "writing files outside the scratch directory": ("landlock", "uid", "audit"),
    "network (TCP, UDP, DNS)": ("net", "seccomp", "audit"),
    "processes outliving the call (fork, setsid, daemons)": ("pid", "seccomp", "uid", "audit"),
}
"""What the sandbox guards against, and the layers that block each, strongest first."""

_SETUP = Path(__file__).resolve().with_name("_sandbox_setup.py")
"""The child run first, by path (``python -I -S -B _SETUP CONFIG``): limits and layers, then it
execs ``python -I -S -B -c <_sandbox_run.py's text> GUARD``, which runs main.py. A status line
(JSON) goes to the trainer through ``status_fd``; the exec closes it."""


@functools.lru_cache(maxsize=1)
def _run_source() -> str:
    """The code interpreter's program (run with ``-c``: Landlock may close its directory)."""
    return Path(__file__).resolve().with_name("_sandbox_run.py").read_text(encoding="utf-8")


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
    """The optional layers that were applied: any of ``"landlock"``, ``"seccomp"``, ``"pid"``,
    ``"net"``, ``"uid"``, ``"fs"``, ``"audit"`` (see the module docstring)."""


def check_limits(**limits: object) -> None:
    """Raise EnvError naming the first limit (a ``run_python`` keyword) that is not a finite
    number in its range: booleans, strings, NaN and infinities are refused. An env should call it
    in its constructor, so a bad config fails at load time, not at the model's first tool call."""
    for name, value in limits.items():
        kind, low, high, unit = _LIMITS[name]
        if not (isinstance(value, kind) and not isinstance(value, bool) and low <= value <= high):
            raise EnvError(f"run_python: {name} must be {unit} from {low} to {high}, got {value!r}")


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_chars: int = 4000,
    max_processes: int = 16,
    disk_mb: int = 64,
) -> SandboxResult:
    """Run ``code`` as a Python script in a sandboxed subprocess (see the module docstring).

    ``code`` comes from the model: one that cannot be run (not a str, or a lone surrogate such as
    ``"\\ud800"``, which a JSON tool call can carry but UTF-8 cannot encode) raises ToolError,
    which a ``ToolEnv`` hands back to the model as a tool error. The limits come from the env's
    author or config: a bad one raises EnvError (``check_limits``), which stops the run.
    """
    _check_code(code)
    check_limits(
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_chars=max_output_chars,
        max_processes=max_processes,
        disk_mb=disk_mb,
    )
    timeout_s = float(timeout_s)
    blocked = _python_binds() if os.geteuid() == 0 and "uid" not in _DISABLED else None
    uid = _pick_uid() if blocked is not None else None
    scratch = tempfile.mkdtemp(prefix="agentrl-sandbox-")
    status_r, status_w = os.pipe()
    try:
        config = _child_config(
            uid,
            blocked,
            scratch,
            _write_code(scratch, code, uid),
            status_w,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            disk_mb=disk_mb,
        )
        proc = _spawn(config, scratch, status_w)
        os.close(status_w)
        status_w = -1
        try:
            (out, err), timed_out = collect_output(proc, timeout_s, max_output_chars * 4)
        finally:
            kill_everything(proc, uid)
        status = read_status(status_r)
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)
    stdout, stderr = cap_output(out, max_output_chars), cap_output(err, max_output_chars)
    error = _explain(proc.returncode, timed_out, stderr, status, timeout_s, memory_mb)
    return SandboxResult(stdout, stderr, proc.returncode, timed_out, error, tuple(status.get("isolation", ())))


def _write_code(scratch: str, code: str, uid: int | None) -> str:
    """The path of ``main.py``, written with ``code`` in ``scratch``; the scratch directory is
    handed to ``uid`` when the child runs as a fresh one."""
    code_path = os.path.join(scratch, "main.py")
    Path(code_path).write_text(code, encoding="utf-8")
    if uid is not None:
        os.chown(scratch, uid, uid)
    return code_path


def _spawn(config: dict[str, Any], scratch: str, status_fd: int) -> subprocess.Popen:
    """Start the bootstrap (``_SETUP``) with ``config`` in ``scratch``: a new session, a minimal
    environment, stdout and stderr piped, ``status_fd`` its one inherited descriptor."""
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", str(_SETUP), json.dumps(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=scratch,
        env=env,
        pass_fds=(status_fd,),
        start_new_session=True,
        close_fds=True,
    )


def _check_code(code: object) -> None:
    """ToolError unless ``code`` is a str that UTF-8 can encode (the model's fault)."""
    if not isinstance(code, str):
        raise ToolError(f"run_python: code must be a str, got {type(code).__name__}")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(
            f"run_python: the code is not valid text: character {exc.start} is a "
            f"lone surrogate ({code[exc.start]!r}), which UTF-8 cannot encode"
        ) from None


def _child_config(
    uid: int | None,
    blocked: tuple[tuple[str, tuple[str, ...]], ...] | None,
    scratch: str,
    code_path: str,
    status_fd: int,
    *,
    timeout_s: float,
    memory_mb: int,
    max_processes: int,
    disk_mb: int,
) -> dict[str, Any]:
    """The JSON object ``_sandbox_setup.main`` reads: what to apply, for whom, where."""
    return {
        "uid": uid,
        "scratch": scratch,
        "code_path": code_path,
        "status_fd": status_fd,
        "memory_bytes": int(memory_mb) << 20,
        "disk_mb": int(disk_mb),
        "cpu_s": int(timeout_s) + 2,
        "max_processes": int(max_processes),
        "disabled": sorted(_DISABLED),
        "hide": [d for d in _WORLD_WRITABLE if os.path.isdir(d)] + [b for b, _ in blocked or ()],
        "world_writable": list(_WORLD_WRITABLE),
        "hide_needed": bool(blocked),
        "binds": [p for _, paths in blocked or () for p in paths] + list(_install_under_tmp()),
        "readable": list(_readable()),
        "devices": list(_DEVICES),
        "python": os.path.realpath(sys.executable),
        "run": _run_source(),
    }


def protections(isolation: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Each of ``THREATS`` -> the layers that block it (empty: NOT blocked), given the layers
    ``isolation`` (default: those one empty script gets on this machine, run once and cached)."""
    layers = _probe() if isolation is None else tuple(isolation)
    return {threat: tuple(layer for layer in blockers if layer in layers) for threat, blockers in THREATS.items()}


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[str, ...]:
    """The layers an empty script gets here."""
    return run_python("pass").isolation


@functools.lru_cache(maxsize=1)
def _install_under_tmp() -> tuple[str, ...]:
    """Python installation paths inside a world-writable directory (a venv or interpreter under
    ``/tmp``): bound back in over the private tmpfs, or the code's interpreter would vanish."""
    python = os.path.realpath(sys.executable)
    install = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python))}
    hidden = [os.path.realpath(d) for d in _WORLD_WRITABLE if os.path.isdir(d)]
    return tuple(sorted(p for p in install if any(p == d or p.startswith(d + os.sep) for d in hidden)))


@functools.lru_cache(maxsize=1)
def _readable() -> tuple[str, ...]:
    """What the code may read besides its scratch directory: system and Python directories."""
    python = (
        sys.base_prefix,
        sys.base_exec_prefix,
        sys.prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    )
    paths = {os.path.realpath(p) for p in (*_SYSTEM, *python) if os.path.exists(p)}
    return tuple(sorted(paths - {"/"}))


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


def _explain(
    code: int | None, timed_out: bool, stderr: str, status: dict, timeout_s: float, memory_mb: int
) -> str | None:
    """One line saying why the sandbox stopped the code, or None if it ran its course."""
    if status.get("error"):
        return f"sandbox setup failed: {status['error']}"
    if timed_out:
        return f"timed out after {timeout_s:g} s; the process group was killed"
    if not status:
        return f"sandbox setup failed: the sandbox stopped before running the code (exit code {code}); see stderr"
    if stderr.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
        return f"memory limit exceeded ({memory_mb} MB per process)"
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        reason = {"SIGXCPU": " (CPU time limit)", "SIGKILL": " (out of memory or killed)"}
        return f"killed by signal {name}{reason.get(name, '')}"
    return None
