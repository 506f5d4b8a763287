"""Env calls made concurrently: ``reset`` or ``step`` of the rollout's episodes, sync methods on a
bounded pool of threads, ``async def`` ones awaited on one event loop, each under the run's
:class:`~agentrl.env.calls.CallGuard`. :meth:`EnvWorkers.submit` makes one call and returns a future
of its outcome (a rollout whose episodes advance on their own waits on these);
:meth:`EnvWorkers.gather` makes many and returns their outcomes in the order of the calls, whichever
env answers first, so a rollout's tokens do not depend on env latency.

Which calls overlap: calls on different env instances (the rollout gives each episode its own), at
most ``workers`` at a time of each kind; the calls on one instance run in the order they were
submitted. An env class with ``concurrent_safe = False`` (its instances share state that is not
thread-safe) has its calls made one after another, sync ones in the submitting thread (the call
is made before :meth:`~EnvWorkers.submit` returns), as with ``workers=1``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import threading
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agentrl.env.calls import CallGuard

Outcome = tuple[Any, BaseException | None]
"""``(result, None)``, or ``(None, exception)`` when the call raised or timed out."""

SERIAL = "serial"
"""The lane of calls made one after another (sync ones in the submitting thread)."""


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
    """Makes env calls concurrently under ``guard`` (module docstring); ``workers`` <= 1 makes them
    one after another, sync ones in the submitting thread."""

    def __init__(self, guard: CallGuard, workers: int) -> None:
        self.guard, self.workers = guard, workers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._lanes: dict[Hashable, collections.deque[tuple[EnvCall, Future]]] = {}
        """Sync calls waiting or running, per env instance, in order (the first one is running)."""
        self._ready: collections.deque[Hashable] = collections.deque()
        """Lanes no thread has taken yet."""
        self._threads = 0
        self._async_lanes: dict[Hashable, list[Any]] = {}
        """Per lane of async calls: [its asyncio.Lock, calls in it] (touched on the event loop only)."""
        self._limit: asyncio.Semaphore | None = None

    def submit(self, call: EnvCall) -> Future:
        """Make ``call`` under the guard; the future's result is its :data:`Outcome`. A call that
        runs in this thread (module docstring) is made before this returns; a BaseException that is
        not an ``Exception`` (a real Ctrl-C) then propagates here, and from a worker comes as the
        outcome's exception."""
        lane = self._lane(call)
        if call.is_async:
            return asyncio.run_coroutine_threadsafe(self._await(call, lane), self._event_loop())
        future: Future = Future()
        if lane is SERIAL:
            future.set_running_or_notify_cancel()
            future.set_result(self._call(call))
            return future
        with self._lock:
            calls = self._lanes.setdefault(lane, collections.deque())
            calls.append((call, future))
            if len(calls) == 1:  # no thread holds this lane: hand it to one
                self._ready.append(lane)
                if self._threads < self.workers:
                    self._threads += 1
                    threading.Thread(target=self._work, name="agentrl-env-worker", daemon=True).start()
        return future

    @staticmethod
    def cancel(futures: Iterable[Future]) -> None:
        """Cancel the calls of ``futures`` not started yet (an ``async def`` one is cancelled where
        it waits); the running ones finish in the background."""
        for future in futures:
            future.cancel()

    def gather(self, calls: Sequence[EnvCall]) -> list[Outcome]:
        """Each call under the guard, as an :data:`Outcome`, in the order of ``calls``. An exception
        that is not an ``Exception`` (a real Ctrl-C) stops the calls not yet started and propagates."""
        futures: dict[int, Future] = {}
        here = [not call.is_async and self._lane(call) is SERIAL for call in calls]
        try:  # the calls made in this thread go last, so that the others run meanwhile
            for i in sorted(range(len(calls)), key=lambda i: here[i]):
                futures[i] = self.submit(calls[i])
            outcomes = [futures[i].result() for i in range(len(calls))]
        except BaseException:
            self.cancel(futures.values())
            raise
        for _, error in outcomes:
            if error is not None and not isinstance(error, Exception):
                raise error
        return outcomes

    def _lane(self, call: EnvCall) -> Hashable:
        """Which calls ``call`` runs one after another with: those on its instance, or
        :data:`SERIAL` (every call made one after another)."""
        if self.workers <= 1 or not getattr(call.env, "concurrent_safe", True):
            return SERIAL
        return id(call.env)

    def _call(self, call: EnvCall) -> Outcome:
        try:
            return self.guard.call(getattr(call.env, call.method), *call.args, **call.kwargs), None
        except Exception as exc:
            return None, exc

    def _work(self) -> None:
        """A worker thread: drains lanes until none is ready."""
        while True:
            with self._lock:
                if not self._ready:
                    self._threads -= 1
                    return
                lane = self._ready.popleft()
            self._drain(lane)

    def _drain(self, lane: Hashable) -> None:
        """Make the calls of ``lane`` in order, the ones submitted meanwhile included."""
        while True:
            with self._lock:
                call, future = self._lanes[lane][0]
            if future.set_running_or_notify_cancel():  # False: cancelled before it started
                try:
                    outcome = self._call(call)
                except BaseException as exc:  # handed to the caller's thread
                    outcome = (None, exc)
                future.set_result(outcome)
            with self._lock:
                calls = self._lanes[lane]
                calls.popleft()
                if not calls:
                    del self._lanes[lane]
                    return

    async def _await(self, call: EnvCall, lane: Hashable) -> Outcome:
        """One ``async def`` call, after the earlier calls of its lane, at most ``workers`` at once."""
        if self._limit is None:
            self._limit = asyncio.Semaphore(max(self.workers, 1))
        entry = self._async_lanes.setdefault(lane, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0], self._limit:
                try:
                    return await self.guard.call_async(getattr(call.env, call.method), *call.args, **call.kwargs), None
                except Exception as exc:
                    return None, exc
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._async_lanes[lane]

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """This pool's event loop, running in a daemon thread from the first async call on: an env's
        loop-bound resources (client sessions) stay usable from one call to the next."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="agentrl-env-loop", daemon=True).start()
        return self._loop
