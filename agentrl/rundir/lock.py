"""One writer per run dir: ``agentrl train`` (and ``--resume``) holds ``<run_dir>/run.lock`` while it runs.

The lock is an ``fcntl.flock`` on that file, which the kernel releases when its holder exits, however
it exits (SIGKILL included). The file names the holder (pid, host, start time), so a second train or
resume of the same run dir is refused naming it. The holder deletes the file when it stops; a file
left behind (the holder was killed) is stale when its lock is free: on this host it is taken over
with a note. A holder on another host cannot be checked from here (and some network filesystems keep
locks per host), so its file is refused with the fix: delete it once that run no longer runs.
``run.lock`` is never followed when it is a symbolic link (nor opened when it is not a regular
file): the run dir's lock would otherwise write into a file elsewhere.

In a run of several processes the top process (``agentrl train --num-processes``) takes the lock
and :meth:`RunLock.share` s it with the processes it launches: each receives the same open file
(``SCM_RIGHTS`` over a Unix socket, :func:`join`), and a ``flock`` belongs to the open file, so it
is released only when the last of them has exited, whichever order they end in. A ``--resume``
beside a training process that outlived the top one is refused. When several processes were
started by hand (``accelerate launch -m agentrl train``), process 0 holds the lock alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import stat
import struct
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

from agentrl.errors import ConfigError, RunDirBusyError

LOCK_FILE = "run.lock"
SHARED_LOCK = "AGENTRL_RUN_LOCK"
"""The environment variable naming the socket a launched process receives the top process's lock from."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run dir's lock."""

    pid: int
    host: str
    started: str
    """Local time the holder took the lock, ISO 8601."""

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host} (since {self.started})"


def read_holder(path: Path) -> Holder | None:
    """The holder a lock file names; None when it is missing, empty, unreadable, a symbolic link
    or not a regular file (a FIFO is never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.pread(fd, 4096, 0))
        return Holder(int(data["pid"]), str(data["host"]), str(data["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


class RunLock:
    """The lock of one run dir: ``with RunLock(run_dir) as lock:`` holds it (``lock.note``: what
    was taken over, else None), creating the run dir if needed (and removing it again at release
    when it is still empty). :class:`RunDirBusyError` when another live process holds it."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.note: str | None = None
        self._fd: int | None = None
        self._created = False
        self._sharing: _Sharing | None = None

    def acquire(self) -> None:
        """Take the lock (see the class); a ConfigError naming the path when it cannot be written."""
        self._created = not self.run_dir.exists()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd, locked = self._open_locked()
        except OSError as exc:
            self._remove_created_dir()
            raise ConfigError(
                f"cannot write the run dir's lock file {str(self.path)!r} ({exc.strerror or exc}): "
                "the run dir must be writable to train in it"
            ) from None
        except ConfigError:
            self._remove_created_dir()
            raise
        try:
            self.note = self._take_over(read_holder(self.path), locked)
            me = Holder(os.getpid(), socket.gethostname(), datetime.now().isoformat(timespec="seconds"))
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me.__dict__).encode() + b"\n", 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self._remove_created_dir()
            raise
        self._fd = fd
        _HELD[self.run_dir.resolve()] = self

    def share(self) -> str:
        """Let processes this one starts hold the lock too (:func:`join`), each until it exits; the
        address they join at (the value of :data:`SHARED_LOCK` in their environment)."""
        if self._fd is None:
            raise RuntimeError(f"{self.path} is not held: only a held lock is shared")
        if self._sharing is None:
            self._sharing = _Sharing(self._fd)
        return self._sharing.address

    def fileno(self) -> int:
        """The locked file's descriptor (a process that inherits it holds the lock with this one)."""
        if self._fd is None:
            raise RuntimeError(f"{self.path} is not held")
        return self._fd

    def release(self) -> None:
        """Delete the lock file and let the lock go (nothing when not held). A shared lock's file is
        deleted only when no process it was shared with still holds it."""
        if self._fd is None:
            return
        _HELD.pop(self.run_dir.resolve(), None)
        if self._sharing is not None:
            self._sharing.stop()  # before the descriptor it sends is closed
            self._sharing = None
            os.close(self._fd)
            self._fd = None
            self._delete_if_free()
        else:
            with contextlib.suppress(OSError):  # gone already, or the dir turned read-only: the lock goes all the same
                self.path.unlink()  # before the lock goes: a waiting process then opens a new file
            os.close(self._fd)
            self._fd = None
        self._remove_created_dir()

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def _open_locked(self) -> tuple[int, bool]:
        """The lock file open and locked by this process; whether the filesystem supports
        ``flock`` (without it only the pid check below protects the run)."""
        while True:
            fd = _open_lock_file(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                os.close(fd)
                raise self._busy(read_holder(self.path)) from None
            except OSError:  # ENOLCK, EOPNOTSUPP: a filesystem without flock
                locked = False
            try:
                if os.path.samestat(os.fstat(fd), os.lstat(self.path)):
                    return fd, locked
            except FileNotFoundError:
                pass
            os.close(fd)  # the holder deleted this file as it let go: lock the one now there

    def _delete_if_free(self) -> None:
        """Delete the lock file when nothing holds its lock any more and it still names this process."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a launched process still holds it
            holder = read_holder(self.path)
            if os.path.samestat(os.fstat(fd), os.lstat(self.path)) and holder and holder.pid == os.getpid():
                self.path.unlink()
        except OSError:
            pass  # its file stays, stale (taken over) once the last process holding it has ended
        finally:
            os.close(fd)

    def _take_over(self, previous: Holder | None, locked: bool) -> str | None:
        """A note when ``previous`` (named by the file, its lock free) is stale; RunDirBusyError
        when it may still run: on another host, or alive here where flock does not work."""
        if previous is None or previous.pid == os.getpid():
            return None
        if previous.host != socket.gethostname():
            raise RunDirBusyError(
                f"run dir {str(self.run_dir)!r} is locked by {previous}, which cannot be checked from host "
                f"{socket.gethostname()}: if that run no longer runs, delete {str(self.path)!r} and start again"
            )
        alive = _alive(previous.pid)
        if alive and not locked:
            raise self._busy(previous)
        why = "whose pid is now another process's" if alive else "which no longer runs"
        return f"note: took over the stale lock {self.path} of {previous}, {why}"

    def _busy(self, holder: Holder | None) -> RunDirBusyError:
        if holder is None:
            who, stop = "another process (it has not written its pid yet)", "it"
        elif holder.host == socket.gethostname() and not _alive(holder.pid):
            who, stop = f"a process started by {holder}, which has ended,", "it to end"
        else:
            who, stop = str(holder), f"it (`kill -TERM {holder.pid}` saves and stops it)"
        return RunDirBusyError(
            f"run dir {str(self.run_dir)!r} is in use: {who} trains in it ({self.path}); "
            f"wait for {stop}, or train into another --output-dir"
        )

    def _remove_created_dir(self) -> None:
        if self._created:
            with contextlib.suppress(OSError):  # only when nothing else was written there
                self.run_dir.rmdir()


_HELD: dict[Path, RunLock] = {}
"""The locks this process holds, by run dir."""


def held_lock(run_dir: str | Path) -> RunLock | None:
    """The lock this process holds on ``run_dir``, if it holds one."""
    return _HELD.get(Path(run_dir).resolve())


def _open_lock_file(path: Path) -> int:
    """``path`` opened for reading and writing (created if missing), never through a symbolic link:
    a ConfigError when it is one or is not a regular file, the file it points to untouched."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if not path.is_symlink():
            raise
        raise ConfigError(
            f"the run dir's lock file {str(path)!r} is a symbolic link (to {os.readlink(path)!r}): a lock file "
            "is never followed; delete the link and start again"
        ) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"the run dir's lock file {str(path)!r} is not a regular file: delete it and start again")
    os.set_blocking(fd, True)
    return fd


class _Sharing:
    """A Unix socket that hands the locked file's descriptor to every process of this user that
    connects (abstract on Linux; elsewhere in a private folder), until :meth:`stop`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        name = f"agentrl-run-lock-{os.getpid()}-{secrets.token_hex(8)}"
        if sys.platform.startswith("linux"):
            self.address, self._folder = "@" + name, None
        else:
            self._folder = tempfile.mkdtemp(prefix="agentrl-")  # mode 0700: this user's processes only
            self.address = os.path.join(self._folder, "lock.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(_socket_address(self.address))
        self._server.listen(64)
        self._thread = threading.Thread(target=self._serve, name="agentrl-run-lock", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # stopped
                return
            with conn, contextlib.suppress(OSError):
                if _peer_uid(conn) in (None, os.getuid()):
                    socket.send_fds(conn, [b"L"], [self.fd])

    def stop(self) -> None:
        """Stop handing the descriptor out (those handed out stay held by their processes)."""
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        self._server.close()
        self._thread.join(timeout=5)
        if self._folder is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.address)
                os.rmdir(self._folder)


_joined: list[int] = []
"""The lock descriptors this process received (:func:`join`): held until it exits."""


def join(run_dir: str | Path, address: str) -> None:
    """Hold ``run_dir``'s lock with the process that shares it at ``address`` (:meth:`RunLock.share`),
    until this process exits; a ConfigError when that fails (the sharing process has ended)."""
    path = Path(run_dir) / LOCK_FILE
    fds: list[int] = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            sock.connect(_socket_address(address))
            _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot hold the lock {str(path)!r} with the process that launched this one "
            f"({exc.strerror or exc}): it has ended"
        ) from None
    for fd in fds:
        os.set_inheritable(fd, False)  # a subprocess this one starts does not keep the run dir locked
    try:
        same = len(fds) == 1 and os.path.samestat(os.fstat(fds[0]), os.lstat(path))
    except OSError:
        same = False
    if not same:
        for fd in fds:
            os.close(fd)
        raise ConfigError(f"the lock shared at {address!r} is not {str(path)!r}'s: it belongs to another run dir")
    _joined.append(fds[0])


def _socket_address(address: str) -> str | bytes:
    """``@name`` (how :data:`SHARED_LOCK` spells Linux's abstract namespace) as the kernel takes it."""
    return b"\0" + address[1:].encode() if address.startswith("@") else address


def _peer_uid(conn: socket.socket) -> int | None:
    """The user id of the process at the other end of ``conn`` (None where the OS does not say)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
