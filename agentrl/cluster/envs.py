"""Env workers as Ray actors (``ray.env_workers: M``): each trainer process starts its share of
the workers (:class:`agentrl.cluster.env_worker.EnvWorker`, placed by ``ray.env_worker_resources``)
and drives them through stand-ins, one per env slot of the run.

A stand-in (:class:`RemoteEnv`) is the local env instance with ``reset``/``step`` (sync or
``async def``, as the env's own) sent to one remote instance on one worker (slots round-robin over
the workers); everything else (tasks, tools, ``max_turns``, ``concurrent_safe``, rewards, the class
name in error messages) is the local instance's. A call answers what the env returns there, or
re-raises what it raised, with its type and message, so ``on_call_error`` treats it as on one host.

Faults: a worker that dies (killed, out of memory, its node lost) is restarted by Ray (up to
``ray.max_restarts``). A stand-in keeps its episode's calls since the last ``reset``; when its
worker died, or came back without its instance, it builds the instance again on the restarted
worker, replays the ``reset`` and the steps, and makes the failed call again: the episode goes on
with the same observations (for envs that depend only on the reset's seed, the task and the
actions). ``faults/env_worker_restarts`` counts the restarts seen, ``faults/env_calls_replayed``
the calls made again. A worker that is gone for good fails the call with one line naming the
worker, its node and the cause; the episode then fails as any env error does (``on_call_error``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from agentrl.cluster import runtime
from agentrl.cluster.env_worker import LOST, OK, EnvSpec, EnvWorker, WorkerInfo
from agentrl.config.cluster import RayConfig
from agentrl.env import Env
from agentrl.errors import ConfigError
from agentrl.model.distributed import world_size

RESTARTS, REPLAYED = f"{runtime.FAULTS}env_worker_restarts", f"{runtime.FAULTS}env_calls_replayed"
EPISODE_METHODS = ("reset", "step")
"""The env methods that carry an episode's state: made on the worker, recorded for a replay."""


class EnvWorkerLost(RuntimeError):
    """An env worker is gone for good (its restarts spent, or not back in time): the call fails as
    an env error (``on_call_error``)."""


class RemoteEnvs:
    """This trainer process's env workers and its stand-ins for ``envs`` (module docstring)."""

    def __init__(
        self,
        envs: list[Env],
        config: Any,
        ray_config: RayConfig,
        plugin_modules: tuple[str, ...] = (),
        disabled_plugins: tuple[str, ...] = (),
    ) -> None:
        processes = world_size()
        if ray_config.env_workers % processes:
            raise ConfigError(
                f"ray.env_workers={ray_config.env_workers} does not split over {processes} trainer processes: "
                "use a multiple of the process count"
            )
        self.ray_config = ray_config
        self.timeout_s = ray_config.start_timeout_s
        self.spec = EnvSpec(
            _absolute(config.env), dict(config.env_args), tuple(plugin_modules), tuple(disabled_plugins)
        )
        ray = runtime.connect(
            ray_config, local_cpus=ray_config.env_workers * ray_config.env_worker_resources.get("CPU", 0)
        )
        actor = ray.remote(EnvWorker).options(
            **runtime.actor_options(ray_config.env_worker_resources),
            max_restarts=ray_config.max_restarts,
            max_task_retries=0,  # a call is made again by its stand-in, after replaying its episode
            max_concurrency=(ray_config.env_worker_slots or int(config.env_workers)) + 2,  # + control calls
        )
        self.workers = [actor.remote(self.spec) for _ in range(ray_config.env_workers // processes)]
        self._lock = threading.Lock()
        self._counts = {RESTARTS: 0.0, REPLAYED: 0.0}
        self.infos: list[WorkerInfo] = runtime.wait_placed(
            [w.ping.remote() for w in self.workers], "env workers", ray_config.env_worker_resources, self.timeout_s
        )
        slots = [list(range(i, len(envs), len(self.workers))) for i in range(len(self.workers))]
        answers = ray.get([w.make.remote(s) for w, s in zip(self.workers, slots)])
        for index, (status, value) in enumerate(answers):
            if status != OK:
                self.close()
                raise ConfigError(
                    f"ray.env_workers: {self.worker_label(index)} cannot build env {config.env!r}: {value}"
                )
        self._next_slot = len(envs)
        self.envs: list[Env] = [
            stand_in(env, Binding(self, slot % len(self.workers), slot)) for slot, env in enumerate(envs)
        ]

    def fresh(self, index: int) -> Env:
        """A new stand-in for slot ``index`` with an instance of its own, built on the same worker
        (for a slot whose call ran past ``call_timeout_s``: the abandoned call may still touch the
        old instance); it replaces ``envs[index]``."""
        ray = runtime.require_ray()
        worker = index % len(self.workers)
        with self._lock:
            slot, self._next_slot = self._next_slot, self._next_slot + 1
        status, value = ray.get(self.workers[worker].make.remote([slot]))
        if status != OK:
            raise EnvWorkerLost(f"{self.worker_label(worker)} cannot build the env again: {value}")
        old = self.envs[index]
        self.envs[index] = stand_in(getattr(old, "_agentrl_local", old), Binding(self, worker, slot))
        return self.envs[index]

    @property
    def description(self) -> str:
        """For the run's banner: how many workers, on which nodes."""
        nodes = ", ".join(runtime.node_label(node) for node in dict.fromkeys(self.worker_nodes()))
        return f"env workers: {len(self.workers)} on {nodes}"

    def worker_nodes(self) -> list[str]:
        """The node id of each worker (as last seen: a restarted worker may be on another node)."""
        return [info.node_id for info in self.infos]

    def worker_label(self, index: int) -> str:
        """``env worker 1 on node 3f2a9c (10.0.0.2)``."""
        return f"env worker {index} on {runtime.node_label(self.infos[index].node_id)}"

    def counts(self) -> dict[str, float]:
        """Restarts seen and calls made again since the last call (``faults/*`` step metrics)."""
        with self._lock:
            counts, self._counts = self._counts, {RESTARTS: 0.0, REPLAYED: 0.0}
        return counts

    def count(self, name: str, amount: float = 1.0) -> None:
        """Add ``amount`` to the count ``name`` (:meth:`counts`)."""
        with self._lock:
            self._counts[name] += amount

    def revive(self, index: int, cause: BaseException | None) -> None:
        """Wait until worker ``index`` answers again after it died (``cause``) or lost its
        instances; count a restart the first time a new life of it answers. EnvWorkerLost when it
        is gone for good or not back within ``ray.start_timeout_s``."""
        ray = runtime.require_ray()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                info = ray.get(self.workers[index].ping.remote(), timeout=max(deadline - time.monotonic(), 0.1))
                break
            except ray.exceptions.ActorUnavailableError as exc:  # restarting: asked again shortly
                cause = exc
                if time.monotonic() > deadline:
                    raise self._lost(index, f"not back within ray.start_timeout_s={self.timeout_s:g}s", cause) from None
                time.sleep(0.2)
            except ray.exceptions.GetTimeoutError:
                raise self._lost(index, f"not back within ray.start_timeout_s={self.timeout_s:g}s", cause) from None
            except ray.exceptions.RayActorError as exc:
                raise self._lost(index, f"max_restarts={self.ray_config.max_restarts} spent", exc) from None
        with self._lock:
            if info.incarnation != self.infos[index].incarnation:
                self.infos[index] = info
                self._counts[RESTARTS] += 1

    def _lost(self, index: int, why: str, cause: BaseException | None) -> EnvWorkerLost:
        return EnvWorkerLost(f"{self.worker_label(index)} is gone ({why}): {death_cause(cause)}")

    def close(self) -> None:
        """Kill the workers (their envs go with them)."""
        ray = runtime.require_ray()
        for worker in self.workers:
            ray.kill(worker, no_restart=True)


class Binding:
    """A stand-in's remote instance: its worker and slot, and its episode's calls since the last
    ``reset`` (what a replay makes again)."""

    def __init__(self, pool: RemoteEnvs, worker: int, slot: int) -> None:
        self.pool, self.worker, self.slot = pool, worker, slot
        self.episode: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``method(*args, **kwargs)`` on the remote instance (module docstring)."""
        ray = runtime.require_ray()
        try:
            answer = ray.get(self._remote(method, args, kwargs))
        except ray.exceptions.RayActorError as exc:
            answer = self.recover(method, args, kwargs, exc)
        return self.finish(method, args, kwargs, answer)

    async def call_async(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`call` for an ``async def`` env method: awaited, no thread (but for a recovery)."""
        ray = runtime.require_ray()
        try:
            answer = await self._remote(method, args, kwargs)
        except ray.exceptions.RayActorError as exc:
            answer = await asyncio.to_thread(self.recover, method, args, kwargs, exc)
        return self.finish(method, args, kwargs, answer)

    def _remote(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.pool.workers[self.worker].call.remote(self.slot, method, args, kwargs)

    def finish(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], answer: tuple[str, Any]) -> Any:
        """The call's result (recorded for a replay), or what the env raised, raised here."""
        status, value = answer
        if status == LOST:
            status, value = self.recover(method, args, kwargs, None)
        if method == "reset":
            self.episode = []
        if status != OK:
            raise value
        self.episode.append((method, args, kwargs))
        return value

    def recover(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], cause: BaseException | None
    ) -> tuple[str, Any]:
        """After the worker died (``cause``) or lost this instance: wait for it, build the
        instance again, replay the episode, and make the call again; its answer."""
        ray = runtime.require_ray()
        worker = self.pool.workers[self.worker]
        while True:
            self.pool.revive(self.worker, cause)
            try:
                status, value = ray.get(worker.make.remote([self.slot]))
                if status != OK:
                    raise EnvWorkerLost(f"{self.pool.worker_label(self.worker)} cannot build the env again: {value}")
                calls = [] if method == "reset" else self.episode
                for replayed, replay_args, replay_kwargs in calls:
                    status, value = ray.get(worker.call.remote(self.slot, replayed, replay_args, replay_kwargs))
                    if status != OK:
                        raise EnvWorkerLost(
                            f"replaying {replayed} on {self.pool.worker_label(self.worker)} did not answer as before: "
                            f"{value!r}"
                        )
                answer = ray.get(worker.call.remote(self.slot, method, args, kwargs))
            except ray.exceptions.RayActorError as exc:  # died again meanwhile
                cause = exc
                continue
            if answer[0] == LOST:
                cause = None
                continue
            self.pool.count(REPLAYED, len(calls) + 1)
            return answer


def _forward(method: str, is_async: bool) -> Callable[..., Any]:
    """The stand-in's ``method``: the call made on its remote instance."""
    if is_async:

        async def forwarded_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await self._agentrl_binding.call_async(method, args, kwargs)

        forwarded_async.__name__ = forwarded_async.__qualname__ = method
        return forwarded_async

    def forwarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._agentrl_binding.call(method, args, kwargs)

    forwarded.__name__ = forwarded.__qualname__ = method
    return forwarded


class RemoteEnv:
    """Marks a stand-in (mixed into a subclass of the env's own class: :func:`stand_in`)."""

    _agentrl_binding: Binding
    _agentrl_local: Env

    @property
    def remote_slot(self) -> tuple[int, int]:
        """(worker index, slot) of this stand-in's remote instance."""
        return self._agentrl_binding.worker, self._agentrl_binding.slot

    @property
    def remote_pool(self) -> RemoteEnvs:
        """The :class:`RemoteEnvs` whose worker runs this stand-in's episodes."""
        return self._agentrl_binding.pool


_CLASSES: dict[type, type] = {}


def stand_in(env: Env, binding: Binding) -> Env:
    """A stand-in for ``env``: an instance of a subclass of its class, named as it is, sharing its
    attributes, whose episode methods run on ``binding``'s remote instance."""
    cls = type(env)
    if cls not in _CLASSES:
        methods = {m: _forward(m, inspect.iscoroutinefunction(getattr(cls, m))) for m in EPISODE_METHODS}
        _CLASSES[cls] = type(
            cls.__name__,
            (RemoteEnv, cls),
            {**methods, "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__},
        )
    remote = object.__new__(_CLASSES[cls])
    remote.__dict__.update(vars(env))
    remote._agentrl_binding, remote._agentrl_local = binding, env
    return remote


def _absolute(env: str) -> str:
    """``env`` with a relative ``file.py`` made absolute (a worker's working directory is not this one)."""
    where, colon, name = env.rpartition(":")
    if colon and where.endswith(".py") and not os.path.isabs(where):
        return f"{os.path.abspath(where)}:{name}"
    return env


def death_cause(exc: BaseException | None) -> str:
    """Why Ray says an actor died, in one short line (``its worker process has died: Worker
    unexpectedly exits ...``, from its ``The actor is dead because ...`` sentence)."""
    if exc is None:
        return "it lost its env instances"
    text = str(exc)
    for line in text.splitlines():
        if line.startswith("The actor is dead because"):
            text = line.removeprefix("The actor is dead because ")
            break
    text = " ".join(text.split(" Some common causes")[0].split())
    text = re.sub(r"\.?\s*Worker exit type: \S+ Worker exit detail: ", ": ", text)
    return text if len(text) <= 110 else text[:109] + "…"
