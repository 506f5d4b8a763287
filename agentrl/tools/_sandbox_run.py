"""The code's interpreter in the sandbox: the audit hook where ``GUARD`` asks for it, then main.py.

``agentrl.tools._sandbox_setup`` execs ``python -I -S -B -c <this file's text> GUARD`` in the scratch
directory, after Landlock may have closed this file's directory to it (hence ``-c``, not a path).
``GUARD`` is the JSON list ``[groups, readable, writable]``: the audit groups to refuse
(``"files"``, ``"net"``, ``"procs"``: see ``agentrl.tools.sandbox``), the directories the code may read and
those it may write (the scratch directory first). main.py's traceback is printed without this
module's frame. The trainer never imports this module; tests may, to check ``refused``.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import traceback

TYPE_CHECKING = False  # not importing typing: it would cost every call ~10 ms of startup
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SPAWN = frozenset({"os.exec", "os.posix_spawn", "os.system", "subprocess.Popen"})
_CHANGES = frozenset(
    {
        "os.chdir",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.mkdir",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.symlink",
        "os.truncate",
        "os.utime",
    }
)


def inside(path: str | bytes, roots: Sequence[str]) -> bool:
    """True if ``path``, symlinks resolved, is one of ``roots`` or below one."""
    real = os.path.realpath(os.fsdecode(path))
    return any(real == r or real.startswith(r + "/") for r in roots)


def refused(
    event: str, args: tuple[Any, ...], groups: frozenset[str], readable: tuple[str, ...], writable: tuple[str, ...]
) -> bool:
    """True if the audit ``event`` with ``args`` falls in one of the refused ``groups``."""
    path = args[0] if args and isinstance(args[0], (str, bytes)) else None
    if "files" in groups:
        if event == "open" and path is not None and not inside(path, writable):
            return bool(args[2] & _WRITES) or os.path.isdir(path) or not inside(path, readable)
        if event in ("os.listdir", "os.scandir") and path is not None:
            return not inside(path, readable + writable)
        if event in _CHANGES:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes))]
            return path is None or not all(inside(p, writable[:1]) for p in paths)
        if event == "import" and args[0] in ("ctypes", "_ctypes", "_posixsubprocess"):
            return True
    if "net" in groups and (event == "socket.__new__" and args[1] != 1 or event.startswith("socket.get")):
        return True
    if "procs" in groups and event in ("os.fork", "os.forkpty"):
        return True
    return event in _SPAWN and ("files" in groups or "procs" in groups)


def guard(groups: Sequence[str], readable: Sequence[str], writable: Sequence[str]) -> None:
    """Add the audit hook that raises PermissionError for what ``refused`` refuses (none if no
    group is asked for). Frozen copies: the code cannot widen what the hook allows."""
    frozen, read, write = frozenset(groups), tuple(readable), tuple(writable)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if refused(event, args, frozen, read, write):
            path = [args[0]] if args and isinstance(args[0], (str, bytes)) else []
            raise PermissionError(13, "refused by the sandbox (%s)" % event, *path)

    if frozen:
        sys.addaudithook(hook)


def main() -> None:
    """Guard, then run main.py as ``__main__``; an exception is its traceback and exit status 1."""
    guard(*json.loads(sys.argv[1]))
    builtins.exit = builtins.quit = sys.exit
    sys.argv = ["main.py"]
    with open("main.py", encoding="utf-8") as f:
        code = f.read()
    try:
        exec(compile(code, "main.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit:
        raise
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        sys.exit(1)


if __name__ == "__main__":
    main()
