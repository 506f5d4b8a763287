"""How a run calls user code (env methods, reward functions): a time limit per call and what a
failure does (``call_timeout_s``, ``on_call_error``)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentrl.errors import ConfigError
from agentrl.faults import plugin_exit

R = TypeVar("R")

ON_CALL_ERROR = ("skip", "fail")
"""Values of ``TrainConfig.on_call_error``."""


class CallTimeout(TimeoutError):
    """A call into user code ran past its time limit and was abandoned (it may still be running)."""


def call_with_timeout(fn: Callable[..., R], timeout_s: float | None, *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``, raising :class:`CallTimeout` if it runs past ``timeout_s`` seconds.

    The call runs in a daemon worker thread the caller waits on. Python cannot kill a thread: a
    call past the limit is abandoned and keeps running in the background until it returns (a
    daemon thread does not keep the process alive). ``timeout_s`` None or <= 0: no limit, the call
    runs in the caller's thread. Exceptions from ``fn`` are re-raised in the caller; a SystemExit or
    KeyboardInterrupt that ``fn`` raised itself as a :class:`agentrl.faults.PluginExit` (the call's
    failure, never the end of the run; a real Ctrl-C still interrupts).
    """
    if timeout_s is None or timeout_s <= 0:
        try:
            return fn(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt) as exc:
            failure = plugin_exit(exc)
            if failure is None:  # a real Ctrl-C
                raise
            raise failure from exc
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller
            outcome["error"] = plugin_exit(exc) or exc

    name = getattr(fn, "__qualname__", type(fn).__name__)
    worker = threading.Thread(target=target, name=f"agentrl-call:{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise CallTimeout(f"no result within call_timeout_s={timeout_s:g} s; the call was abandoned and may still "
                          "be running in a background thread")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@dataclass
class CallGuard:
    """How a run calls user code (env methods, reward functions): a time limit per call, what an
    exception or a timeout does (``on_error``: ``skip`` or ``fail``) and which plugins have
    already been warned about (each once)."""

    timeout_s: float | None = None
    """``call_timeout_s``: seconds one call may take (None or <= 0: no limit)."""
    on_error: str = "fail"
    """``on_call_error``: ``skip`` (the sample is unscored and counted) or ``fail`` (stop the run)."""
    warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.on_error not in ON_CALL_ERROR:
            raise ConfigError(f"on_call_error={self.on_error!r} is invalid: expected one of {', '.join(ON_CALL_ERROR)}")

    @classmethod
    def from_config(cls, config: Any) -> CallGuard:
        """The guard of a run config (``call_timeout_s``, ``on_call_error``); a config without
        them gets no time limit and ``fail``."""
        return cls(getattr(config, "call_timeout_s", None), getattr(config, "on_call_error", "fail"))

    @property
    def skips(self) -> bool:
        """True when a failed call leaves its sample unscored instead of stopping the run."""
        return self.on_error == "skip"

    def call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` under the time limit (see :func:`call_with_timeout`)."""
        return call_with_timeout(fn, self.timeout_s, *args, **kwargs)

    def warn_once(self, plugin: str, message: str) -> None:
        """A RuntimeWarning ``message`` the first time ``plugin`` fails in this run only."""
        if plugin not in self.warned:
            self.warned.add(plugin)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
