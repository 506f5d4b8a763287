"""A run dir may come from someone else: agentrl never writes through a symbolic link in it.

A link named ``metrics.jsonl`` (or ``checkpoints/``, ``model/model.safetensors``, ...) would make a
resumed run append to, cut or overwrite the file it points to, outside the run dir. So a run dir
holding a link anywhere is refused before anything is written (:func:`refuse_links`, one line
naming the link and its target), and the files agentrl writes by name are opened with
``O_NOFOLLOW`` or replaced by a rename, which never writes through a link
(docs/concepts/run-dir.md#untrusted-run-dirs).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, BinaryIO

from agentrl.errors import ConfigError


def first_link(run_dir: Path) -> Path | None:
    """The first symbolic link inside ``run_dir`` (at any depth, links not followed), or None."""
    for top, dirs, files in os.walk(run_dir, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(top) / name
            if path.is_symlink():
                return path
    return None


def refuse_links(run_dir: Path, command: str) -> None:
    """A ConfigError naming the first symbolic link inside ``run_dir`` and where it points
    (``command``: what was refused, e.g. ``--resume 'runs/x'``); nothing when there is none."""
    link = first_link(run_dir)
    if link is None:
        return
    raise ConfigError(
        f"{command}: {str(link)!r} is a symbolic link (to {os.readlink(link)!r}); agentrl never writes "
        "through a link in a run dir, as that would change the file it points to: replace the link "
        "with a copy of the file itself"
    )


def open_nofollow(path: Path, mode: str) -> IO[str] | IO[bytes]:
    """``path`` opened (``"a"``: append text, ``"r+b"``: read and write bytes) without following a
    symbolic link at its name: a link is a ConfigError naming it, other failures raise as OSError."""
    flags = {"a": os.O_WRONLY | os.O_APPEND | os.O_CREAT, "r+b": os.O_RDWR}[mode]
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(_link_message(path)) from None
        raise
    return os.fdopen(fd, mode)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file renamed over it (:func:`replace_file`)."""
    replace_file(path, lambda f: f.write(text.encode("utf-8")))


def replace_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Let ``write`` fill a fresh temporary file beside ``path`` (opened for binary writing), then
    rename it over ``path``: a link at ``path`` is replaced by the file, never written through (a
    link as its folder is a ConfigError), and a kill leaves the old file or the new one; the
    temporary file is gone on failure, whose error is raised."""
    if path.parent.is_symlink():
        raise ConfigError(_link_message(path.parent))
    tmp = path.with_name(f".{path.name}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _link_message(path: Path) -> str:
    return (
        f"{str(path)!r} is a symbolic link (to {os.readlink(path)!r}); agentrl never writes through a link "
        "in a run dir: replace the link with a copy of the file itself"
    )
