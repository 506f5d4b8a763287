"""Which code a run dir's config may make agentrl import (docs/concepts/run-dir.md#untrusted-run-dirs).

``--resume RUN``, ``--resume RUN --print-config`` and ``agentrl eval RUN`` take the env and the
rewards from ``RUN/config.yaml``. Its ``path/file.py:NAME`` and ``module:NAME`` specs are code, so
before anything is imported :func:`refuse_run_dir_code` checks each one the config alone supplies
(one this command does not name itself):

* a file inside the run dir (symbolic links resolved), or a module that would be imported from
  there, is refused: whoever handed over the run dir wrote it. Naming it on the command line
  (``--env RUN/env.py:Env``) runs it: the user has then chosen that code;
* a relative path is refused too (agentrl stores absolute ones, so the config was written by hand);
* a file outside the run dir runs (a resumed run of your own dir keeps using your env file) when
  you (or root) own it and nobody else may write to it; a file another user owns, or anyone may
  change, is refused as above.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agentrl.config.yaml_text import load_yaml
from agentrl.errors import ConfigError
from agentrl.imports import absolute_spec

_PY_FILE = re.compile(r"[^\s:'\"{},=\[\]]+\.py")


def code_specs(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(config key, spec) of each piece of code a config (as its YAML holds it) names: its env and
    its rewards given as ``file.py:NAME`` or ``module:NAME`` (registered names are the installed plugins')."""
    env, rewards = config.get("env"), config.get("rewards")
    specs = [("env", env)] if isinstance(env, str) and ":" in env else []
    names = rewards if isinstance(rewards, dict) else {}
    return specs + [("rewards", name) for name in names if isinstance(name, str) and ":" in name]


def named_files(values: Iterable[Any]) -> set[Path]:
    """The ``.py`` files named in the command line's ``values`` (flags, ``--set`` items), resolved."""
    found = set()
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            for match in _PY_FILE.findall(str(item)) if item is not None else []:
                found.add(Path(match).expanduser().resolve())
    return found


def refuse_run_dir_code(
    config: dict[str, Any], run_dir: Path, named: set[Path], command: str, flag: Callable[[str, str], str]
) -> None:
    """A ConfigError for the first spec of ``config`` (the run's config.yaml as read, or the part of
    it a command takes) that :func:`untrusted` finds (``named``: the files this command names
    itself; ``flag(key, spec)``: the option that would run it)."""
    for key, spec in code_specs(config):
        problem = untrusted(spec, run_dir, named)
        if problem is not None:
            raise ConfigError(
                f"{command}: the run's config.yaml names {key} code {spec!r}, {problem}; agentrl imports "
                f"such code only when the command names it: add {flag(key, spec)} to run it"
            )


def check_resumed_code(
    config: Any, run_dir: Path, env: str | None, rewards: dict[str, float], command_line: list[str]
) -> None:
    """``--resume``: ``--env`` / ``--reward`` (``rewards``, as given in ``command_line``) name the
    run's own env and rewards (a resumed run keeps its config), which lets their code run from
    inside the run dir; the code the run's config.yaml alone names goes through :func:`refuse_run_dir_code`."""
    command = f"--resume {str(run_dir)!r}"
    if env is not None and absolute_spec(env) != config.env:
        raise ConfigError(
            f"{command}: --env {env!r} is not the run's env {config.env!r}; a resumed run keeps its env "
            "(--env may only name it, to run its code)"
        )
    own = ", ".join(config.rewards or {}) or "none"
    for name in rewards:
        if absolute_spec(name) not in (config.rewards or {}):
            raise ConfigError(
                f"{command}: --reward {name!r} is not one of the run's rewards ({own}); a resumed run "
                "keeps its rewards (--reward may only name them, to run their code)"
            )
    data = load_yaml((run_dir / "config.yaml").read_text(), where=str(run_dir / "config.yaml"))
    refuse_run_dir_code(
        data if isinstance(data, dict) else {},
        run_dir,
        named_files([env, *command_line]),
        command,
        lambda key, spec: f"--env {spec}" if key == "env" else f"--reward {spec}",
    )


def untrusted(spec: str, run_dir: Path, named: set[Path]) -> str | None:
    """Why ``spec`` (from ``run_dir``'s config) may not be imported, None when it may."""
    where = spec.rpartition(":")[0]
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_absolute():
            return "a relative path (agentrl stores absolute ones)"
        resolved = path.resolve()
        if resolved in named:
            return None
        if resolved.is_relative_to(run_dir.resolve()):
            return "a file inside the run dir"
        return _foreign(resolved)
    origin = _module_origin(where.partition(".")[0])
    if origin is not None and origin.resolve().is_relative_to(run_dir.resolve()) and origin.resolve() not in named:
        return f"a module imported from inside the run dir ({str(origin)!r})"
    return None


def _foreign(path: Path) -> str | None:
    """Why the file at ``path`` is not the user's own code: another user owns it, or anyone may
    write to it; None when it is (or it is missing: the import says so)."""
    try:
        info = path.stat()
    except OSError:
        return None
    if info.st_uid not in (os.getuid(), 0):
        return f"a file another user owns (uid {info.st_uid})"
    if info.st_mode & stat.S_IWOTH:
        return "a file anyone may write to"
    return None


def _module_origin(name: str) -> Path | None:
    """Where a top-level module ``name`` would be imported from (the current directory first, as
    agentrl imports modules), without importing anything; None when nowhere or built in."""
    if not name.isidentifier() or name in sys.modules:
        return None
    found = importlib.machinery.PathFinder.find_spec(name, [os.getcwd(), *sys.path])
    if found is None:
        return None
    if found.origin not in (None, "namespace") and found.origin:
        return Path(found.origin)
    locations = list(found.submodule_search_locations or [])
    return Path(locations[0]) if locations else None
