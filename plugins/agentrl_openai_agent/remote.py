"""Agent programs on other machines: the ``openai_agent`` rollout's workers in Ray actors.

With a ``ray`` section whose ``env_workers`` is above 0, each trainer process starts
``env_workers / processes`` actors placed by ``ray.env_worker_resources`` (a custom resource puts
them on CPU-only nodes), each hosting an :class:`agentrl_openai_agent.workers.AgentWorkers` pool
(:class:`AgentHost`); :class:`RemoteAgentWorkers` has the local pool's interface and hands each
episode to an idle slot of one of them. An episode's time limit is kept here, where its waits
for the model are known: past it the actor is told to end it (``stop``).

The endpoint must be reachable from the actors' nodes: :func:`check_bind` refuses at start-up a
loopback address while an actor runs on another node (node IPs as Ray reports them), and before
the first step every actor fetches the endpoint's health route (:meth:`RemoteAgentWorkers.check_reach`).

An actor that dies (its node lost, the process killed) is restarted by Ray (``ray.max_restarts``);
the episodes it was running raise :class:`WorkerLost` and the rollout runs them again from the
start, with the same seed and fresh URLs; :meth:`RemoteAgentWorkers.counts` reports the restarts.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from agentrl import ConfigError, EnvError, RayConfig, one_line
from agentrl_openai_agent.address import is_loopback
from agentrl_openai_agent.agent_process import POLL_S
from agentrl_openai_agent.workers import AgentLoadError, AgentWorkers, Outcome, TaskNotSent, timeout_error

RESTARTS = "faults/agent_worker_restarts"
"""Agent worker actors restarted by Ray (the episodes they ran are run again)."""
RERUNS = "faults/agent_episodes_rerun"
"""Episodes run again because their worker actor died."""
REACH_TIMEOUT_S = 10.0
"""How long an actor's health check of the endpoint may take."""


class WorkerLost(Exception):
    """The actor running an episode died; it has been restarted and the episode must run again."""


class AgentHost:
    """The body of an agent worker actor: an :class:`AgentWorkers` pool on the actor's node."""

    def __init__(self, spec: str, call: dict[str, Any] | None = None) -> None:
        self.workers = AgentWorkers(spec, 0, call)
        self.incarnation = uuid.uuid4().hex
        self._events: dict[str, tuple[threading.Event, threading.Event]] = {}
        self._lock = threading.Lock()

    def where(self) -> dict[str, Any]:
        """Where this actor runs: Ray node id and IP, hostname, pid, and its incarnation (new after a restart)."""
        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "incarnation": self.incarnation,
        }

    def grow(self, size: int) -> str | None:
        """Grow the pool to ``size`` workers; the error line when a worker cannot import the agent."""
        try:
            self.workers.grow(size)
        except AgentLoadError as exc:
            return str(exc)
        return None

    def reach(self, url: str) -> str | None:
        """Fetch ``url`` (the endpoint's health route); None when it answers ok, else what happened."""
        try:
            with urllib.request.urlopen(url, timeout=REACH_TIMEOUT_S) as response:
                body = response.read(1000)
        except urllib.error.HTTPError as exc:
            return f"it answered HTTP {exc.code} (another server at that address?)"
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)  # a URLError wraps the socket's error
            return one_line(reason) if isinstance(reason, BaseException) else str(reason)
        return None if b'"ok"' in body else f"it answered {body[:80]!r}"

    def _pair(self, episode: str) -> tuple[threading.Event, threading.Event]:
        with self._lock:
            return self._events.setdefault(episode, (threading.Event(), threading.Event()))

    def run(self, episode: str, task: Any, base_url: str, api_key: str) -> Outcome:
        """Run ``episode`` in an idle worker until its agent ends or :meth:`stop` is called."""
        stop, returned = self._pair(episode)
        try:
            return self.workers.run(task, base_url, api_key, None, returned=returned.set, stop=stop)
        finally:
            returned.set()

    def returned(self, episode: str) -> bool:
        """Block until ``episode``'s agent function has returned (or the episode ended); then forget it."""
        _, returned = self._pair(episode)
        returned.wait()
        with self._lock:
            self._events.pop(episode, None)
        return True

    def stop(self, episode: str) -> None:
        """End ``episode`` as timed out (its worker is killed and replaced)."""
        self._pair(episode)[0].set()

    def pids(self) -> list[int]:
        """The pool's worker process ids."""
        return self.workers.pids()

    def close(self) -> None:
        """End the pool's workers and what they started."""
        self.workers.close()


def check_bind(host: str, advertise: str, here: str, places: list[dict[str, Any]]) -> None:
    """ConfigError when the endpoint binds or advertises a loopback address while an agent worker
    runs on another machine (a node IP other than ``here``, this node's)."""
    away = [(i, place) for i, place in enumerate(places) if place["ip"] != here]
    loopback = host if is_loopback(host) else advertise if is_loopback(advertise) else None
    if away and loopback is not None:
        index, place = away[0]
        raise ConfigError(
            f"plugins.openai_agent.host={host!r} (advertised as {advertise!r}) is this machine's loopback, but "
            f"agent worker {index} runs on node {place['node'][:6]} ({place['ip']}): bind 0.0.0.0 or this node's "
            f"IP {here} (or leave host unset)"
        )


def auto_host(here: str, places: list[dict[str, Any]]) -> str:
    """The endpoint's address when ``host`` is null: loopback while every agent worker runs on this
    machine (IP ``here``), else this node's IP (the one Ray's nodes reach it by)."""
    return "127.0.0.1" if all(place["ip"] == here for place in places) else here


class RemoteAgentWorkers:
    """:class:`AgentWorkers`' interface over ``count`` Ray actors placed by the ``ray`` config's
    ``env_worker_resources`` (module docstring); the actors start with the first :meth:`grow`,
    their workers calling the agent as ``call`` says (:class:`AgentWorkers`), set before it."""

    def __init__(self, spec: str, ray_config: RayConfig, count: int, concurrency: int) -> None:
        self.spec, self.ray_config, self.count = spec, ray_config, count
        self.call: dict[str, Any] | None = None
        self.concurrency = concurrency
        """At most how many episodes all actors together run at once (their threads are sized by it)."""
        self.actors: list[Any] = []
        self.places: list[dict[str, Any]] = []
        """Each actor's :meth:`AgentHost.where`, updated after a restart."""
        self.sizes: list[int] = [0] * count
        self.size = 0
        self._slots: queue.Queue[int] = queue.Queue()
        self._locks = [threading.Lock() for _ in range(count)]
        self._counts = {RESTARTS: 0.0, RERUNS: 0.0}
        self._counts_lock = threading.Lock()

    def _start(self) -> None:
        """Start the actors and wait until Ray has placed them (one-line ConfigError when it cannot)."""
        ray = connect(self.ray_config)
        resources = dict(self.ray_config.env_worker_resources)
        rest = {name: amount for name, amount in resources.items() if name not in ("CPU", "GPU")}
        per_actor = -(-self.concurrency // self.count)
        env = dict(self.ray_config.runtime_env)
        env["env_vars"] = {"PYTHONPATH": import_path(), **dict(env.get("env_vars", {}))}
        host = ray.remote(AgentHost).options(
            num_cpus=resources.get("CPU", 0),
            num_gpus=resources.get("GPU", 0),
            resources=rest,
            max_restarts=self.ray_config.max_restarts,
            max_task_retries=0,
            max_concurrency=2 * per_actor + 4,
            runtime_env=env,
        )
        self.actors = [host.remote(self.spec, self.call) for _ in range(self.count)]
        timeout_s = self.ray_config.start_timeout_s
        try:
            self.places = ray.get([actor.where.remote() for actor in self.actors], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise ConfigError(
                f"ray: {self.count} openai_agent worker actor(s) needing {resources} not placed within "
                f"{timeout_s:g}s: the cluster has {_shown(ray.cluster_resources())} in all, "
                f"{_shown(ray.available_resources())} free (lower ray.env_worker_resources, add nodes, or raise "
                "ray.start_timeout_s)"
            ) from None

    def grow(self, size: int) -> None:
        """Bring the actors' pools to ``size`` workers in all (spread evenly); AgentLoadError when a
        worker cannot import the agent."""
        if not self.actors:
            self._start()
        if size <= self.size:
            return
        import ray

        for slot in range(self.size, size):
            self.sizes[slot % self.count] += 1
            self._slots.put(slot % self.count)
        self.size = size
        errors = ray.get([actor.grow.remote(n) for actor, n in zip(self.actors, self.sizes)])
        for index, error in enumerate(errors):
            if error is not None:
                raise AgentLoadError(f"{error} (agent worker {index} on {self.label(index)})")

    def label(self, index: int) -> str:
        """``node 3f2a9c (10.0.0.5) host:pid`` of actor ``index``."""
        place = self.places[index]
        return f"node {place['node'][:6]} ({place['ip']}) {place['host']}:{place['pid']}"

    def check_reach(self, url: str, shown: str) -> None:
        """Every actor fetches ``url`` (the health route; ``shown``: it with the secret hidden);
        ConfigError naming the first actor's node that cannot."""
        import ray

        errors = ray.get([actor.reach.remote(url) for actor in self.actors])
        for index, error in enumerate(errors):
            if error is not None:
                raise ConfigError(
                    f"openai_agent: agent worker {index} on {self.label(index)} cannot reach the endpoint at {shown}: "
                    f"{error}; set plugins.openai_agent.advertise_host to this machine's address as that node sees "
                    "it, and host to an address that accepts it (0.0.0.0: every interface)"
                )

    def run(
        self,
        task: Any,
        base_url: str,
        api_key: str,
        limit_s: float | None = None,
        waited: Callable[[], float] = lambda: 0.0,
        returned: Callable[[], None] = lambda: None,
    ) -> Outcome:
        """One episode on an idle slot of an actor (:meth:`AgentWorkers.run`'s contract); WorkerLost
        when the actor died meanwhile (restarted by then), EnvError when it cannot be restarted."""
        slot = self._slots.get()
        try:
            return self._run_on(slot, task, base_url, api_key, limit_s, waited, returned)
        finally:
            self._slots.put(slot)

    def _run_on(
        self,
        index: int,
        task: Any,
        base_url: str,
        api_key: str,
        limit_s: float | None,
        waited: Callable[[], float],
        returned: Callable[[], None],
    ) -> Outcome:
        import ray

        actor, episode, incarnation = self.actors[index], uuid.uuid4().hex, self.places[index]["incarnation"]
        done = actor.run.remote(episode, task, base_url, api_key)
        back = actor.returned.remote(episode)
        pending, started, stopped = [done, back], time.monotonic(), False
        while done in pending:
            ready, _ = ray.wait(pending, num_returns=1, timeout=POLL_S)
            if back in ready:
                returned()
            pending = [ref for ref in pending if ref not in ready]
            if limit_s and not stopped and time.monotonic() - started - waited() > limit_s:
                actor.stop.remote(episode)
                stopped = True
        try:
            outcome = ray.get(done)
        except ray.exceptions.RayActorError:
            self._restarted(index, incarnation)
            raise WorkerLost(f"agent worker {index} died") from None
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, TaskNotSent):
                raise TaskNotSent(str(exc.cause)) from None
            raise
        return dataclasses.replace(outcome, error=timeout_error(limit_s)) if outcome.timed_out else outcome

    def _restarted(self, index: int, incarnation: str) -> None:
        """After actor ``index`` died: wait until Ray restarted it, regrow its pool, count it (once per restart)."""
        import ray

        with self._locks[index]:
            if self.places[index]["incarnation"] == incarnation:
                actor = self.actors[index]  # calls retried through the restart, failing once it is dead for good
                try:
                    place = ray.get(
                        actor.where.options(max_task_retries=-1).remote(), timeout=self.ray_config.start_timeout_s
                    )
                    error = ray.get(actor.grow.options(max_task_retries=-1).remote(self.sizes[index]))
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    raise EnvError(
                        f"openai_agent: agent worker {index} on {self.label(index)} died and was not restarted "
                        f"(ray.max_restarts={self.ray_config.max_restarts})"
                    ) from None
                if error is not None:
                    raise EnvError(f"openai_agent: restarted agent worker {index}: {error}")
                self.places[index] = place
                with self._counts_lock:
                    self._counts[RESTARTS] += 1
        with self._counts_lock:
            self._counts[RERUNS] += 1

    def counts(self) -> dict[str, float]:
        """Restarts and reruns since the last call."""
        with self._counts_lock:
            counts, self._counts = self._counts, {RESTARTS: 0.0, RERUNS: 0.0}
        return counts

    def pids(self) -> list[int]:
        """Every actor's worker process ids."""
        import ray

        return [pid for pids in ray.get([actor.pids.remote() for actor in self.actors]) for pid in pids]

    def close(self) -> None:
        """End the actors' workers, then the actors."""
        if "ray" not in sys.modules or not self.actors:
            return
        import ray

        if ray.is_initialized():
            try:
                ray.get([actor.close.remote() for actor in self.actors], timeout=30)
            except ray.exceptions.RayError:
                pass
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
        self.actors = []


def import_path() -> str:
    """This process's import path as ``PYTHONPATH``: actors on this machine import what it imports."""
    return os.pathsep.join(entry for entry in sys.path if entry and os.path.isdir(entry))


def connect(ray_config: RayConfig) -> Any:
    """The ``ray`` module, joined to the config's cluster unless this process has joined one already
    (the run's env workers or engines usually have); ConfigError when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray section needs Ray: pip install 'agentrl[ray]'") from None
    if not ray.is_initialized():
        env = dict(ray_config.runtime_env)
        env["env_vars"] = {"PYTHONPATH": import_path(), **dict(env.get("env_vars", {}))}
        address = ray_config.address or os.environ.get("RAY_ADDRESS")
        try:
            ray.init(address=address, runtime_env=env, logging_level="WARNING", include_dashboard=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"ray.address={address!r}: cannot join that cluster ({one_line(exc)})") from None
    return ray


def _shown(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in sorted(resources.items()) if not k.startswith(("node:", "memory", "object_store"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"
