"""The sandbox's first child: applies the limits and layers, then execs the code's interpreter.

``agentrl.tools.sandbox.run_python`` runs this file by path as ``python -I -S -B _sandbox_setup.py CONFIG``
(standard library only: no site-packages), before any untrusted code; ``CONFIG`` is a JSON object
(see ``agentrl.tools.sandbox._child_config``). It reports the layers it applied (JSON lines) through
``status_fd`` and then execs ``python -I -S -B -c <_sandbox_run.py> GUARD``; the exec closes the status
pipe. The trainer never imports this module; tests may, to check a piece of it.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import sys

TYPE_CHECKING = False  # not importing typing: it would cost every call ~10 ms of startup
if TYPE_CHECKING:
    from typing import Any

_L = ctypes.c_long
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38


def load_libc() -> ctypes.CDLL:
    """This process's C library, with ``mount`` and ``syscall`` typed."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.syscall.restype = ctypes.c_long
    return libc


def syscall(libc: ctypes.CDLL, *args: Any) -> int:
    """syscall(2) with integer arguments as C longs."""
    return libc.syscall(*[_L(a) if isinstance(a, int) else a for a in args])


def mount(
    libc: ctypes.CDLL, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    """mount(2); OSError naming ``dst`` if it fails."""

    def enc(s: str | None) -> bytes | None:
        return s.encode() if s else None

    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount " + dst)


def report(cfg: dict[str, Any], done: list[str], **extra: Any) -> None:
    """One status line (the layers applied so far, plus ``extra``) to the trainer."""
    os.write(cfg["status_fd"], (json.dumps(dict(isolation=done, **extra)) + "\n").encode())


def landlock(libc: ctypes.CDLL, cfg: dict[str, Any], done: list[str]) -> bool:
    """Read the system, write the scratch dir; no TCP, no signals out (by ABI). True if applied."""
    abi = syscall(libc, 444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, ..._VERSION)
    if abi < 1:
        return False
    fs = (1 << (13, 14, 15, 15, 16)[min(abi, 5) - 1]) - 1  # every filesystem right of this ABI
    attr = struct.pack("QQQ", fs, 3, 3)[: (8, 8, 8, 16, 16, 24)[min(abi, 6) - 1]]
    ruleset = syscall(libc, 444, attr, len(attr), 0)
    if ruleset < 0:
        return False
    read = 1 | 4 | 8  # EXECUTE | READ_FILE | READ_DIR
    rules = [(p, read) for p in cfg["readable"]] + [(p, 2 | 4 | 1 << 14) for p in cfg["devices"]]
    rules += [(cfg["scratch"], fs)] + ([("/proc", read)] if "pid" in done else [])
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        if not os.path.isdir(path):
            access &= 1 | 2 | 4 | 1 << 14 | 1 << 15  # the rights a file rule may hold
        syscall(libc, 445, ruleset, 1, struct.pack("=Qi", access & fs, fd), 0)  # PATH_BENEATH
        os.close(fd)
    ok = syscall(libc, 446, ruleset, 0) == 0
    os.close(ruleset)
    return ok


def seccomp_program(machine: str) -> list[bytes] | None:
    """The BPF filter: setsid, setpgid, io_uring and non-AF_UNIX sockets fail (None: unknown arch)."""
    arch = {"x86_64": (0xC000003E, 41, 112, 109, 425), "aarch64": (0xC00000B7, 198, 157, 154, 425)}.get(machine)
    if arch is None:
        return None

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    def refuse(errno: int) -> bytes:
        return op(6, 0x50000 | errno)

    allow = op(6, 0x7FFF0000)
    prog = [
        op(0x20, 4),
        op(0x15, arch[0], 1),
        refuse(1),  # another ABI (i386): refuse everything
        op(0x20, 0),
        op(0x35, 0x40000000, 0, 1),
        refuse(1),
    ]  # x32 syscalls: refuse
    for nr in arch[2:]:
        prog += [op(0x15, nr, 0, 1), refuse(1)]
    prog += [op(0x15, arch[1], 1), allow, op(0x20, 16), op(0x15, 1, 0, 1), allow, refuse(13)]
    return prog


def seccomp(libc: ctypes.CDLL) -> bool:
    """Install ``seccomp_program``; True if applied."""
    prog = seccomp_program(os.uname().machine)
    if prog is None:
        return False
    buf = ctypes.create_string_buffer(b"".join(prog))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
    return libc.prctl(_L(PR_SET_SECCOMP), _L(2), fprog, _L(0), _L(0)) == 0  # SECCOMP_MODE_FILTER


def own_processes() -> int:
    """Processes and threads of this real uid (RLIMIT_NPROC counts them all)."""
    mine = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/status" % pid) as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == os.getuid():
            mine += int(status.get("Threads", "1"))
    return mine


def private_mounts(libc: ctypes.CDLL, cfg: dict[str, Any], done: list[str]) -> bool:
    """A private mount namespace, with the ``"fs"`` layer when a uid is dropped; True if private.
    A half-built view is refused: report and exit 70 rather than run without it."""
    uid, off, scratch = cfg["uid"], set(cfg["disabled"]), cfg["scratch"]
    private = changed = False
    if {"fs", "pid"} <= off or libc.unshare(CLONE_NEWNS) != 0:
        return False
    try:
        mount(libc, None, "/", None, 0x4000 | 0x40000)  # MS_REC | MS_PRIVATE: nothing leaks out
        private = True
        if uid is not None and "fs" not in off:
            binds = [(p, os.open(p, os.O_PATH)) for p in cfg["binds"]]
            changed = True
            for d in cfg["hide"]:
                mode = "1777,size=16m" if d in cfg["world_writable"] else "755,size=1m"
                mount(libc, "tmpfs", d, "tmpfs", 2 | 4, "mode=" + mode)  # MS_NOSUID | MS_NODEV
            for p, fd in binds:
                os.makedirs(p, exist_ok=True)
                mount(libc, "/proc/self/fd/%d" % fd, p, None, 0x1000 | 0x4000)  # MS_BIND | MS_REC
                mount(libc, None, p, None, 0x1000 | 0x20 | 1)  # MS_BIND | MS_REMOUNT | MS_RDONLY
                os.close(fd)
            os.makedirs(scratch, exist_ok=True)
            mount(
                libc, "tmpfs", scratch, "tmpfs", 2 | 4, "mode=700,uid=%d,gid=%d,size=%dm" % (uid, uid, cfg["disk_mb"])
            )
            done.append("fs")
    except OSError as exc:
        if changed:
            report(cfg, done, error="could not set up the private mount namespace: %s" % exc)
            sys.exit(70)
    return private


def pid_namespace(libc: ctypes.CDLL, cfg: dict[str, Any], done: list[str]) -> None:
    """Become PID 1 of a new PID namespace with its own /proc: when it exits, everything in it
    dies. The parent left outside waits and exits as the namespace's PID 1 did."""
    if libc.unshare(CLONE_NEWPID) != 0:
        return
    child = os.fork()
    if child:
        os.close(cfg["status_fd"])
        status = os.waitpid(child, 0)[1]
        if os.WIFSIGNALED(status):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    libc.prctl(_L(PR_SET_PDEATHSIG), _L(signal.SIGKILL))  # die with that parent
    try:
        mount(libc, "proc", "/proc", "proc", 2 | 4 | 8)  # MS_NOSUID | MS_NODEV | MS_NOEXEC
        done.append("pid")
    except OSError:
        pass


def limit(res: int, n: int) -> None:
    """Set both limits of ``res`` to ``n``, never above the inherited hard limit (only root may)."""
    hard = resource.getrlimit(res)[1]
    n = n if hard == resource.RLIM_INFINITY else min(n, hard)
    resource.setrlimit(res, (n, n))


def isolate(libc: ctypes.CDLL, cfg: dict[str, Any], done: list[str]) -> int:
    """The namespaces (user, net, mount, pid) this machine allows; the processes RLIMIT_NPROC must
    leave room for besides ``max_processes``."""
    off = set(cfg["disabled"])
    mine = own_processes() if cfg["uid"] is None and os.getuid() != 0 else 0
    if os.geteuid() != 0 and not {"net", "pid"} <= off and libc.unshare(CLONE_NEWUSER) == 0:
        if tuple(map(int, os.uname().release.split(".")[:2])) >= (5, 14):
            mine = 0  # since Linux 5.14 a new user namespace counts its own processes only
    if "net" not in off and libc.unshare(CLONE_NEWNET) == 0:
        done.append("net")
    if private_mounts(libc, cfg, done) and "pid" not in off:
        pid_namespace(libc, cfg, done)
    return mine


def restrict(libc: ctypes.CDLL, cfg: dict[str, Any], done: list[str], mine: int) -> None:
    """Resource limits, the uid drop, no new privileges, then Landlock and seccomp."""
    uid, off = cfg["uid"], set(cfg["disabled"])
    limit(resource.RLIMIT_AS, cfg["memory_bytes"])
    limit(resource.RLIMIT_FSIZE, cfg["disk_mb"] << 20)
    limit(resource.RLIMIT_CPU, cfg["cpu_s"])
    limit(resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-big file is an OSError, not a kill
    if uid is not None and (not cfg["hide_needed"] or "fs" in done):
        os.chown("main.py", uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        done.append("uid")
    limit(resource.RLIMIT_NPROC, cfg["max_processes"] + mine)
    libc.prctl(_L(PR_SET_PDEATHSIG), _L(signal.SIGKILL))  # die with our parent (setuid clears it)
    libc.prctl(_L(PR_SET_NO_NEW_PRIVS), _L(1), _L(0), _L(0), _L(0))  # no setuid programs; lets us:
    if "landlock" not in off and landlock(libc, cfg, done):
        done.append("landlock")
    if "seccomp" not in off and seccomp(libc):
        done.append("seccomp")


def audit_groups(done: list[str]) -> list[str]:
    """What the code's audit hook must refuse: each group no stronger applied layer covers."""
    return [
        name
        for name, stronger in (
            ("files", {"landlock"}),
            ("net", {"net", "seccomp"}),
            ("procs", {"pid", "seccomp", "uid"}),
        )
        if not stronger & set(done)
    ]


def main(cfg: dict[str, Any]) -> None:
    """Isolate, write main.py in the scratch directory, restrict, report, exec the code's Python."""
    done: list[str] = []
    libc = load_libc()
    with open(cfg["code_path"], encoding="utf-8") as f:
        code = f.read()
    mine = isolate(libc, cfg, done)
    os.chdir(cfg["scratch"])
    with open("main.py", "w", encoding="utf-8") as f:
        f.write(code)
    restrict(libc, cfg, done, mine)
    guard = audit_groups(done)
    readable = cfg["readable"] + (["/proc"] if "pid" in done else [])
    if guard:
        done.append("audit")
    report(cfg, done)
    os.set_inheritable(cfg["status_fd"], False)  # closed by the exec: end of the status
    try:
        os.execv(
            cfg["python"],
            [
                cfg["python"],
                "-I",
                "-S",
                "-B",
                "-c",
                cfg["run"],
                json.dumps([guard, readable, [cfg["scratch"]] + cfg["devices"]]),
            ],
        )
    except OSError as exc:
        report(cfg, done, error="could not start Python for the code: %s" % exc)
        os._exit(70)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
