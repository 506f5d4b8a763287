"""One turn's env calls at once: ``reset`` (or ``step``) of every live episode, sync methods on a
bounded pool of threads, ``async def`` ones awaited on one event loop, each under the run's
:class:`~agentrl.env.calls.CallGuard`. Results come back in the order of the calls, whichever env
answers first, so a rollout's tokens do not depend on env latency.

Which calls overlap: calls on different env instances (the rollout gives each episode its own), at
most ``workers`` at a time of each kind; the calls on one instance run in their order. An env
class with ``concurrent_safe = False`` (its instances share state that is not thread-safe) has
its calls made one after another, sync ones in the caller's thread, as with ``workers=1``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.env.calls import CallGuard

Outcome = tuple[Any, BaseException | None]
"""``(result, None)``, or ``(None, exception)`` when the call raised or timed out."""


@dataclass(frozen=True)
class EnvCall:
    """One call of an env method: ``getattr(env, method)(*args, **kwargs)``."""

    env: Any
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_async(self) -> bool:
        """True when the method is an ``async def`` (awaited on the event loop, no thread of its own)."""
        return inspect.iscoroutinefunction(getattr(self.env, self.method))


class EnvWorkers:
    """Makes a turn's env calls concurrently under ``guard`` (module docstring); ``workers`` <= 1
    makes them one after another, sync ones in the caller's thread."""

    def __init__(self, guard: CallGuard, workers: int) -> None:
        self.guard, self.workers = guard, workers
        self._loop: asyncio.AbstractEventLoop | None = None

    def gather(self, calls: Sequence[EnvCall]) -> list[Outcome]:
        """Each call under the guard, as an :data:`Outcome`, in the order of ``calls``. An exception
        that is not an ``Exception`` (a real Ctrl-C) stops the calls not yet started and propagates."""
        outcomes: list[Outcome] = [(None, None)] * len(calls)
        kinds = [call.is_async for call in calls]
        pending = None
        if any(kinds):
            groups, serial = self._split([i for i, k in enumerate(kinds) if k], calls)
            pending = asyncio.run_coroutine_threadsafe(self._gather_async(groups, serial, calls, outcomes),
                                                       self._event_loop())
        groups, serial = self._split([i for i, k in enumerate(kinds) if not k], calls)
        queue = collections.deque(groups)
        threads = [threading.Thread(target=self._work, args=(queue, calls, outcomes), name="agentrl-env-worker",
                                    daemon=True) for _ in range(min(self.workers, len(groups)))]
        try:
            for thread in threads:
                thread.start()
            for i in serial:
                outcomes[i] = self._call(calls[i])
            for thread in threads:
                thread.join()
            if pending is not None:
                pending.result()
        except BaseException:
            queue.clear()
            if pending is not None:
                pending.cancel()
            raise
        for _, error in outcomes:
            if error is not None and not isinstance(error, Exception):
                raise error
        return outcomes

    def _split(self, indices: list[int], calls: Sequence[EnvCall]) -> tuple[list[list[int]], list[int]]:
        """(groups that may run at the same time, each the calls on one instance in order; the calls
        to make one after another)."""
        if self.workers <= 1:
            return [], indices
        groups: dict[int, list[int]] = {}
        serial = []
        for i in indices:
            if getattr(calls[i].env, "concurrent_safe", True):
                groups.setdefault(id(calls[i].env), []).append(i)
            else:
                serial.append(i)
        return list(groups.values()), serial

    def _call(self, call: EnvCall) -> Outcome:
        try:
            return self.guard.call(getattr(call.env, call.method), *call.args, **call.kwargs), None
        except Exception as exc:
            return None, exc

    def _work(self, queue: collections.deque[list[int]], calls: Sequence[EnvCall], outcomes: list[Outcome]) -> None:
        """A worker thread: takes groups of calls from ``queue`` until it is empty."""
        while True:
            try:
                group = queue.popleft()
            except IndexError:
                return
            for i in group:
                try:
                    outcomes[i] = self._call(calls[i])
                except BaseException as exc:  # handed to the caller's thread
                    outcomes[i] = (None, exc)

    async def _gather_async(self, groups: list[list[int]], serial: list[int], calls: Sequence[EnvCall],
                            outcomes: list[Outcome]) -> None:
        limit = asyncio.Semaphore(max(self.workers, 1))

        async def run(group: list[int]) -> None:
            for i in group:
                call = calls[i]
                async with limit:
                    try:
                        outcomes[i] = (await self.guard.call_async(getattr(call.env, call.method), *call.args,
                                                                   **call.kwargs), None)
                    except Exception as exc:
                        outcomes[i] = (None, exc)

        await asyncio.gather(*(run(group) for group in [*groups, serial]))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """This pool's event loop, running in a daemon thread from the first async call on: an env's
        loop-bound resources (client sessions) stay usable from one call to the next."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="agentrl-env-loop", daemon=True).start()
        return self._loop

