"""The env worker actor's side of :mod:`agentrl.cluster.envs`: :class:`EnvWorker` builds env
instances on its node the way a one-host run does (the plugins installed there, a registered name
or ``path/file.py:Class``, ``env_args`` with the tool parser named in them) and makes their
``reset``/``step`` calls, many episodes' at once (a threaded actor; ``async def`` methods run on one
event loop of the worker, so loop-bound clients stay usable from one call to the next).

Each call answers ``(status, value)``: :data:`OK` and the method's result, :data:`RAISED` and what
the env raised (the exception itself, so the trainer re-raises it with its type and message), or
:data:`LOST` when the worker has no instance in that slot (it was restarted since the slot was
built: the stand-in rebuilds it and replays its episode)."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentrl.env import Env, build_env, load_env_class
from agentrl.errors import AgentRLError, one_line
from agentrl.tools.calls import resolve_tool_parser

OK, RAISED, LOST = "ok", "raised", "lost"
"""What an env call on a worker came to (module docstring)."""


@dataclass(frozen=True)
class EnvSpec:
    """How a worker builds the run's env: what ``make_env`` reads from the run config, and the
    plugins to load besides the installed ones."""

    env: str
    env_args: dict[str, Any] = field(default_factory=dict)
    plugin_modules: tuple[str, ...] = ()
    """Plugin modules given with ``--plugin`` (the installed ones load by their entry points)."""
    disabled_plugins: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerInfo:
    """Who answered a worker's ping: its life (a new one after each restart), node and process."""

    incarnation: str
    node_id: str
    pid: int


class EnvWorker:
    """One env worker actor: env instances by slot, called by the trainer's stand-ins."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self.info = WorkerInfo(uuid.uuid4().hex, _node_id(), os.getpid())
        self.envs: dict[int, Env] = {}
        self._factory: Any = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def ping(self) -> WorkerInfo:
        """This worker's :class:`WorkerInfo` (it answers once it is placed and started)."""
        return self.info

    def make(self, slots: list[int]) -> tuple[str, Any]:
        """Build an env instance in each slot: ``(OK, WorkerInfo)``, or ``(RAISED, one line)``
        saying why the env cannot be built on this node."""
        try:
            for slot in slots:
                env = self._build()
                with self._lock:
                    self.envs[slot] = env
        except (Exception, SystemExit) as exc:
            return RAISED, str(exc) if isinstance(exc, AgentRLError) else one_line(exc)
        return OK, self.info

    def call(self, slot: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        """``getattr(env, method)(*args, **kwargs)`` on the instance in ``slot`` (module docstring)."""
        env = self.envs.get(slot)
        if env is None:
            return LOST, None
        function = getattr(env, method)
        try:
            if inspect.iscoroutinefunction(function):
                result = asyncio.run_coroutine_threadsafe(function(*args, **kwargs), self._event_loop()).result()
            else:
                result = function(*args, **kwargs)
        except BaseException as exc:  # the env's failure, handed to the trainer
            return RAISED, _portable(exc)
        return OK, result

    def _build(self) -> Env:
        """One env instance, as ``agentrl.training.build.make_env`` makes it."""
        spec = self.spec
        manager = None
        if self._factory is None:
            if ":" in spec.env:
                self._factory = load_env_class(spec.env)
            else:
                manager = self._plugins()
                self._factory = manager.registry.get("env", spec.env).factory
        env_args = dict(spec.env_args)
        if isinstance(env_args.get("tool_parser"), str):
            manager = manager or self._plugins()
            env_args = resolve_tool_parser(env_args, lambda name: manager.registry.get("tool_parser", name).factory)
        env = build_env(self._factory, env_args, spec.env)
        if not isinstance(env, Env):
            raise TypeError(f"env {spec.env!r} built a {type(env).__name__}, not an agentrl.Env")
        return env

    def _plugins(self) -> Any:
        """The plugins as the CLI loads them: the installed ones less the disabled, plus ``--plugin`` modules."""
        from agentrl.plugins import load_plugins

        return load_plugins(disabled=self.spec.disabled_plugins, modules=self.spec.plugin_modules)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop ``async def`` env methods run on, in a daemon thread from the first such call."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="agentrl-env-loop", daemon=True).start()
            return self._loop


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (its type and message reach the trainer as they are), else a
    RuntimeError with its one-line text."""
    from ray import cloudpickle

    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:
        return RuntimeError(one_line(exc))
    exc.__traceback__ = None
    return exc
