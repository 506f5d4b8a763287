"""Import user code named on the command line: ``path/to/file.py`` or ``package.module``, plus ``:NAME``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from agentrl.errors import AgentRLError, ConfigError, EnvError
from agentrl.faults import plugin_exit


def import_module_or_file(where: str, what: str) -> ModuleType:
    """The module at ``where``: a ``.py`` file (loaded once per path) or an import path, with the
    current directory importable as under ``python -m``. Failures are a ConfigError naming ``what``."""
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{what}: file {where!r} does not exist")
        name = f"agentrl_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            del sys.modules[name]
            failure = _import_failure(exc)
            if failure is None:  # a real Ctrl-C
                raise
            raise ConfigError(f"{what}: {where!r} failed to import: {failure!r}") from exc
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")
    try:
        return importlib.import_module(where)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        failure = _import_failure(exc)
        if failure is None:  # a real Ctrl-C
            raise
        raise ConfigError(f"{what}: module {where!r} failed to import: {failure!r}") from exc


def _import_failure(exc: BaseException) -> Exception | None:
    """What an import raised, as an Exception (a SystemExit / KeyboardInterrupt the module raised
    itself as a PluginExit); None for a real Ctrl-C."""
    return exc if isinstance(exc, Exception) else plugin_exit(exc)


def load_object(spec: str, what: str) -> Any:
    """The object named by ``path/file.py:NAME`` or ``package.module:NAME``."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"{what} {spec!r} must look like 'path/file.py:NAME' or 'package.module:NAME'")
    module = import_module_or_file(where, f"{what} {spec!r}")
    if not hasattr(module, attr):
        public = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))
        raise ConfigError(f"{what} {spec!r}: {where!r} has no {attr!r}; it defines: {', '.join(public) or '(nothing)'}")
    return getattr(module, attr)


def absolute_spec(spec: str) -> str:
    """``file.py:NAME`` with the file made absolute, so a saved config works from any directory."""
    where, sep, attr = spec.rpartition(":")
    if sep and where.endswith(".py"):
        return f"{Path(where).expanduser().resolve()}:{attr}"
    return spec


def import_extra(module: str, install_hint: str, error: type[AgentRLError] = EnvError) -> ModuleType:
    """The optional library ``module`` an adapter needs, or ``error(install_hint)`` when it is not
    installed (the hint names the ``agentrl[EXTRA]`` that installs it)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise error(install_hint) from exc
