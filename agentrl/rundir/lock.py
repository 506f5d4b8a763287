"""One writer per run dir: ``agentrl train`` (and ``--resume``) holds ``<run_dir>/run.lock`` while it runs.

The lock is an ``fcntl.flock`` on that file, which the kernel releases when its holder exits, however
it exits (SIGKILL included). The file names the holder (pid, host, start time), so a second train or
resume of the same run dir is refused naming it. The holder deletes the file when it stops; a file
left behind (the holder was killed) is stale when its lock is free: on this host it is taken over
with a note. A holder on another host cannot be checked from here (and some network filesystems keep
locks per host), so its file is refused with the fix: delete it once that run no longer runs.

In a run of several processes the top process holds the lock (``agentrl train --num-processes``),
or process 0 when they were started by hand (``accelerate launch -m agentrl train``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

from agentrl.errors import ConfigError, RunDirBusyError

LOCK_FILE = "run.lock"


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
    """The holder a lock file names; None when it is missing, empty or unreadable."""
    try:
        data = json.loads(Path(path).read_text())
        return Holder(int(data["pid"]), str(data["host"]), str(data["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


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

    def release(self) -> None:
        """Delete the lock file and let the lock go (nothing when not held)."""
        if self._fd is None:
            return
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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                os.close(fd)
                raise self._busy(read_holder(self.path)) from None
            except OSError:  # ENOLCK, EOPNOTSUPP: a filesystem without flock
                locked = False
            try:
                if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                    return fd, locked
            except FileNotFoundError:
                pass
            os.close(fd)  # the holder deleted this file as it let go: lock the one now there

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


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
