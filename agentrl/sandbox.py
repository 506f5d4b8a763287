"""Run untrusted Python code (a model's tool call) in a subprocess, never in the trainer.

``run_python(code)`` starts ``sys.executable -I -S -B`` (no ``PYTHON*`` variables, no
site-packages: only the standard library; no ``.pyc`` files) in a fresh scratch directory with a
minimal environment (``PATH``; ``HOME`` and ``TMPDIR`` set to the scratch directory; nothing
inherited, so no secrets). A bootstrap in the child applies the limits and layers below, then
``exec``s a fresh interpreter for the code, so nothing it loaded (``ctypes``) is left there; the
trainer never calls the thread-unsafe ``preexec_fn``.

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
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.errors import EnvError
from agentrl.tools import ToolError

_UID_BASE, _UID_SPAN = 1_500_000_000, 500_000_000
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_GRACE_S = 0.5  # after the main process exits, how long to wait for children holding its pipes
_DISABLED: frozenset[str] = frozenset()
"""Layers not to apply, to exercise the fallbacks (tests only)."""

_LIMITS: dict[str, tuple[type, float, float, str]] = {
    "timeout_s": (numbers.Real, 0.01, 3600, "a number of seconds"),
    "memory_mb": (numbers.Integral, 64, 1 << 20, "an integer number of MB"),
    "max_output_chars": (numbers.Integral, 1, 10 ** 8, "an integer number of characters"),
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

# Runs in the child as ``python -I -S -B -c _BOOTSTRAP CONFIG``, before any untrusted code; then
# execs ``python -I -S -B -c _RUN GUARD``, which runs main.py. A status line (JSON) goes to the
# trainer through status_fd; the exec closes it.
_BOOTSTRAP = r"""
import ctypes, json, os, resource, signal, struct, sys
cfg = json.loads(sys.argv[1])
done, uid, off, scratch = [], cfg["uid"], set(cfg["disabled"]), cfg["scratch"]
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
def call(*args):  # syscall(2) with integer arguments as C longs
    return libc.syscall(*[L(a) if isinstance(a, int) else a for a in args])
def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: s.encode() if s else None
    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount " + dst)
def report(**extra):
    os.write(cfg["status_fd"], (json.dumps(dict(isolation=done, **extra)) + "\n").encode())
def landlock():  # read the system, write the scratch dir; no TCP, no signals out (by ABI)
    abi = call(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return False
    fs = (1 << (13, 14, 15, 15, 16)[min(abi, 5) - 1]) - 1  # every filesystem right of this ABI
    attr = struct.pack("QQQ", fs, 3, 3)[:(8, 8, 8, 16, 16, 24)[min(abi, 6) - 1]]
    ruleset = call(444, attr, len(attr), 0)
    if ruleset < 0:
        return False
    read = 1 | 4 | 8  # EXECUTE | READ_FILE | READ_DIR
    rules = [(p, read) for p in cfg["readable"]] + [(p, 2 | 4 | 1 << 14) for p in cfg["devices"]]
    rules += [(scratch, fs)] + ([("/proc", read)] if "pid" in done else [])
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        if not os.path.isdir(path):
            access &= 1 | 2 | 4 | 1 << 14 | 1 << 15  # the rights a file rule may hold
        call(445, ruleset, 1, struct.pack("=Qi", access & fs, fd), 0)  # LANDLOCK_RULE_PATH_BENEATH
        os.close(fd)
    ok = call(446, ruleset, 0) == 0
    os.close(ruleset)
    return ok
def seccomp():  # setsid, setpgid, io_uring and non-AF_UNIX sockets fail
    arch = {"x86_64": (0xC000003E, 41, 112, 109, 425),
            "aarch64": (0xC00000B7, 198, 157, 154, 425)}.get(os.uname().machine)
    if arch is None:
        return False
    op = lambda code, k, jt=0, jf=0: struct.pack("HBBI", code, jt, jf, k)
    refuse, allow = (lambda errno: op(6, 0x50000 | errno)), op(6, 0x7FFF0000)
    prog = [op(0x20, 4), op(0x15, arch[0], 1), refuse(1),  # another ABI (i386): refuse everything
            op(0x20, 0), op(0x35, 0x40000000, 0, 1), refuse(1)]  # x32 syscalls: refuse
    for nr in arch[2:]:
        prog += [op(0x15, nr, 0, 1), refuse(1)]
    prog += [op(0x15, arch[1], 1), allow, op(0x20, 16), op(0x15, 1, 0, 1), allow, refuse(13)]
    buf = ctypes.create_string_buffer(b"".join(prog))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
    return libc.prctl(L(22), L(2), fprog, L(0), L(0)) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
with open(cfg["code_path"], encoding="utf-8") as f:
    code = f.read()
mine = 0  # RLIMIT_NPROC counts every process and thread of the real uid
if uid is None and os.getuid() != 0:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(l.split(":", 1) for l in open("/proc/%s/status" % pid) if ":" in l)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == os.getuid():
            mine += int(status.get("Threads", "1"))
if os.geteuid() != 0 and not {"net", "pid"} <= off and libc.unshare(0x10000000) == 0:
    if tuple(map(int, os.uname().release.split(".")[:2])) >= (5, 14):  # CLONE_NEWUSER done:
        mine = 0  # since Linux 5.14 a new user namespace counts its own processes only
if "net" not in off and libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
    done.append("net")
private = changed = False
if not {"fs", "pid"} <= off and libc.unshare(0x00020000) == 0:  # CLONE_NEWNS
    try:
        mount(None, "/", None, 0x4000 | 0x40000)  # MS_REC | MS_PRIVATE: nothing leaks out
        private = True
        if uid is not None and "fs" not in off:
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
if private and "pid" not in off and libc.unshare(0x20000000) == 0:  # CLONE_NEWPID
    child = os.fork()  # PID 1 of the new namespace: when it exits, everything in it dies
    if child:  # wait outside, and exit as it did
        os.close(cfg["status_fd"])
        status = os.waitpid(child, 0)[1]
        if os.WIFSIGNALED(status):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    libc.prctl(L(1), L(signal.SIGKILL))  # PR_SET_PDEATHSIG: die with that parent
    try:
        mount("proc", "/proc", "proc", 2 | 4 | 8)  # MS_NOSUID | MS_NODEV | MS_NOEXEC
        done.append("pid")
    except OSError:
        pass
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
libc.prctl(L(1), L(signal.SIGKILL))  # PR_SET_PDEATHSIG: die with our parent (setuid clears it)
libc.prctl(L(38), L(1), L(0), L(0), L(0))  # PR_SET_NO_NEW_PRIVS: no setuid programs; lets us:
if "landlock" not in off and landlock():
    done.append("landlock")
if "seccomp" not in off and seccomp():
    done.append("seccomp")
guard = [name for name, stronger in (("files", {"landlock"}), ("net", {"net", "seccomp"}),
                                     ("procs", {"pid", "seccomp", "uid"})) if not stronger & set(done)]
readable = cfg["readable"] + (["/proc"] if "pid" in done else [])
if guard:
    done.append("audit")
report()
os.set_inheritable(cfg["status_fd"], False)  # closed by the exec: end of the status
try:
    os.execv(cfg["python"], [cfg["python"], "-I", "-S", "-B", "-c", cfg["run"],
                             json.dumps([guard, readable, [scratch] + cfg["devices"]])])
except OSError as exc:
    report(error="could not start Python for the code: %s" % exc)
    os._exit(70)
"""

# The code's interpreter: the audit hook where ``GUARD`` (groups, readable, writable) asks for
# it (see the module docstring), then main.py, its traceback without this frame.
_RUN = r"""
import builtins, json, sys, traceback
def guard(groups, readable, writable):
    import os
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    spawn = {"os.exec", "os.posix_spawn", "os.system", "subprocess.Popen"}
    changes = {"os.chdir", "os.chmod", "os.chown", "os.link", "os.mkdir", "os.remove",
               "os.rename", "os.rmdir", "os.symlink", "os.truncate", "os.utime"}
    def inside(path, roots):
        path = os.path.realpath(os.fsdecode(path))
        return any(path == r or path.startswith(r + "/") for r in roots)
    def refused(event, args):
        path = args[0] if args and isinstance(args[0], (str, bytes)) else None
        if "files" in groups:
            if event == "open" and path is not None and not inside(path, writable):
                return args[2] & writes or os.path.isdir(path) or not inside(path, readable)
            if event in ("os.listdir", "os.scandir") and path is not None:
                return not inside(path, readable + writable)
            if event in changes:
                paths = [a for a in args[:2] if isinstance(a, (str, bytes))]
                return path is None or not all(inside(p, writable[:1]) for p in paths)
            if event == "import" and args[0] in ("ctypes", "_ctypes", "_posixsubprocess"):
                return True
        if "net" in groups and (event == "socket.__new__" and args[1] != 1
                                or event.startswith("socket.get")):
            return True
        if "procs" in groups and event in ("os.fork", "os.forkpty"):
            return True
        return event in spawn and ("files" in groups or "procs" in groups)
    def hook(event, args):
        if refused(event, args):
            path = [args[0]] if args and isinstance(args[0], (str, bytes)) else []
            raise PermissionError(13, "refused by the sandbox (%s)" % event, *path)
    if groups:
        sys.addaudithook(hook)
guard(*json.loads(sys.argv[1]))
del guard
builtins.exit = builtins.quit = sys.exit
sys.argv = ["main.py"]
with open("main.py", encoding="utf-8") as f:
    code = f.read()
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
    """The optional layers that were applied: any of ``"landlock"``, ``"seccomp"``, ``"pid"``,
    ``"net"``, ``"uid"``, ``"fs"``, ``"audit"`` (see the module docstring)."""


def check_limits(**limits: object) -> None:
    """Raise EnvError naming the first limit (a ``run_python`` keyword) that is not a finite
    number in its range: booleans, strings, NaN and infinities are refused. An env should call it
    in its constructor, so a bad config fails at load time, not at the model's first tool call."""
    for name, value in limits.items():
        kind, low, high, unit = _LIMITS[name]
        if not (isinstance(value, kind) and not isinstance(value, bool) and low <= value <= high):
            raise EnvError(f"run_python: {name} must be {unit} from {low} to {high}, "
                           f"got {value!r}")


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512,
               max_output_chars: int = 4000, max_processes: int = 16, disk_mb: int = 64
               ) -> SandboxResult:
    """Run ``code`` as a Python script in a sandboxed subprocess (see the module docstring).

    ``code`` comes from the model: one that cannot be run (not a str, or a lone surrogate such as
    ``"\\ud800"``, which a JSON tool call can carry but UTF-8 cannot encode) raises ToolError,
    which a ``ToolEnv`` hands back to the model as a tool error. The limits come from the env's
    author or config: a bad one raises EnvError (``check_limits``), which stops the run.
    """
    if not isinstance(code, str):
        raise ToolError(f"run_python: code must be a str, got {type(code).__name__}")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(f"run_python: the code is not valid text: character {exc.start} is a "
                        f"lone surrogate ({code[exc.start]!r}), which UTF-8 cannot encode"
                        ) from None
    check_limits(timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars,
                 max_processes=max_processes, disk_mb=disk_mb)
    timeout_s = float(timeout_s)
    blocked = _python_binds() if os.geteuid() == 0 and "uid" not in _DISABLED else None
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
            "disabled": sorted(_DISABLED),
            "hide": [d for d in _WORLD_WRITABLE if os.path.isdir(d)] + [b for b, _ in blocked or ()],
            "world_writable": list(_WORLD_WRITABLE), "hide_needed": bool(blocked),
            "binds": [p for _, paths in blocked or () for p in paths] + list(_install_under_tmp()),
            "readable": list(_readable()), "devices": list(_DEVICES),
            "python": os.path.realpath(sys.executable), "run": _RUN,
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


def protections(isolation: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Each of ``THREATS`` -> the layers that block it (empty: NOT blocked), given the layers
    ``isolation`` (default: those one empty script gets on this machine, run once and cached)."""
    layers = _probe() if isolation is None else tuple(isolation)
    return {threat: tuple(l for l in blockers if l in layers) for threat, blockers in THREATS.items()}


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
    python = (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable)))
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
