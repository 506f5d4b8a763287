"""How a run calls user code (env methods, reward functions): a time limit per call and what a
failure does (``call_timeout_s``, ``on_call_error``)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

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
    failure, never the end of the run; a real Ctrl-C still interrupts). An ``async def`` ``fn`` runs
    to completion on an event loop of its own (the rollout awaits env coroutines on its loop
    instead: :meth:`CallGuard.call_async`).
    """
    if inspect.iscoroutinefunction(fn):
        fn = _on_own_loop(fn)
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
        raise CallTimeout(
            f"no result within call_timeout_s={timeout_s:g} s; the call was abandoned and may still "
            "be running in a background thread"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _on_own_loop(fn: Callable[..., Awaitable[R]]) -> Callable[..., R]:
    """``fn`` (an ``async def``) as a blocking function: each call runs on a fresh event loop."""

    def blocking(*args: Any, **kwargs: Any) -> R:
        return asyncio.run(fn(*args, **kwargs))

    blocking.__qualname__ = getattr(fn, "__qualname__", "coroutine")
    return blocking


async def await_with_timeout(fn: Callable[..., Awaitable[R]], timeout_s: float | None, *args: Any, **kwargs: Any) -> R:
    """``await fn(*args, **kwargs)``, raising :class:`CallTimeout` if it runs past ``timeout_s``
    seconds (None or <= 0: no limit). Past the limit the coroutine is cancelled (unlike a thread, it
    can be). A SystemExit or KeyboardInterrupt it raises is its failure, a
    :class:`agentrl.faults.PluginExit` (it never stops the event loop)."""

    async def settled() -> tuple[Any, BaseException | None]:
        try:
            return await fn(*args, **kwargs), None
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # handed to the caller below
            return None, exc if isinstance(exc, Exception) else plugin_exit(exc) or exc

    limit = timeout_s if timeout_s is not None and timeout_s > 0 else None
    try:  # only the limit raises TimeoutError here: settled() returns the coroutine's own errors
        value, error = await asyncio.wait_for(settled(), limit)
    except asyncio.TimeoutError:
        raise CallTimeout(f"no result within call_timeout_s={timeout_s:g} s; the coroutine was cancelled") from None
    if error is not None:
        raise error
    return value


@dataclass
class CallGuard:
    """How a run calls user code (env methods, reward functions): a time limit per call, what an
    exception or a timeout does (``on_error``: ``skip`` or ``fail``) and which plugins have
    already been warned about (each once)."""

    timeout_s: float | None = None
    """``call_timeout_s``: seconds one call may take (None or <= 0: no limit)."""
    on_error: Literal["skip", "fail"] = "fail"
    """``on_call_error``: ``skip`` (the sample is unscored and counted) or ``fail`` (stop the run).
    Checked where the user sets it (``TrainConfig.on_call_error``); here any value but ``skip``
    stops the run."""
    warned: set[str] = field(default_factory=set)

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

    async def call_async(self, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
        """``await fn(*args, **kwargs)`` under the time limit (see :func:`await_with_timeout`)."""
        return await await_with_timeout(fn, self.timeout_s, *args, **kwargs)

    def warn_once(self, plugin: str, message: str) -> None:
        """A RuntimeWarning ``message`` the first time ``plugin`` fails in this run only."""
        if plugin not in self.warned:
            self.warned.add(plugin)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
