"""Engine replicas as Ray actors (``ray.engines: K``): :class:`RemoteEngines`.

Each trainer process drives ``K / processes`` replicas, each the config's engine with its own copy
of the weights (:class:`agentrl.cluster.replica.EngineReplica`), placed by ``ray.engine_resources``.

* ``generate`` splits the prompts over the replicas (a conversation's later turns go to the replica
  that sampled its earlier ones: :class:`agentrl.cluster.routing.PrefixRouter`), with each prompt's
  own seed (``SamplingParams.seeds_for`` of the whole call), so every prompt samples the tokens the
  in-process engine would, whichever replica runs it.
* ``sync_weights`` puts the trainer's weights into Ray's object store once and every replica loads
  them from there; the newest weights stay referenced for a replica Ray restarts.
* A replica that dies during a call is restarted by Ray (``ray.max_restarts``): the call waits for
  it, sends it the newest weights and runs its prompts again with the same seeds, so the call
  returns the same tokens. ``counts()`` reports ``faults/engine_restarts`` and
  ``perf/weight_sync_seconds`` since its last call (the run sums them over processes into the
  step's metrics). When the restarts are spent, an EngineError names the replica, node and cause.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import torch

from agentrl.cluster import runtime
from agentrl.cluster.replica import EngineReplica, pack_weights, plugin_choice
from agentrl.cluster.routing import PrefixRouter
from agentrl.config.cluster import RayConfig
from agentrl.config.train import TrainConfig
from agentrl.errors import AgentRLError, ConfigError, EngineError
from agentrl.model import distributed
from agentrl.sampling.engine import Engine, Generation, SamplingParams

RESTARTS = f"{runtime.FAULTS}engine_restarts"
SYNC_SECONDS = "perf/weight_sync_seconds"


class RemoteEngines(Engine):
    """This trainer process's engine replicas on a Ray cluster (see the module docstring).

    ``model``: the policy as the engine samples it (its weights are sent to the replicas now);
    ``manager``: the run's plugins, which the replicas load alike (None: every installed plugin)."""

    keeps_synced_model = False  # each replica holds a copy

    def __init__(
        self,
        config: TrainConfig,
        ray_config: RayConfig,
        model: torch.nn.Module,
        tokenizer: Any = None,
        manager: Any = None,
    ) -> None:
        check_engines(config, ray_config, distributed.world_size())
        self.config, self.ray_config = config, ray_config
        count = ray_config.engines // distributed.world_size()
        self.ray = runtime.connect(ray_config, local_cpus=count * ray_config.engine_resources.get("CPU", 0) + 1)
        options = {
            **runtime.actor_options(ray_config.engine_resources),
            "max_restarts": ray_config.max_restarts,
            "max_task_retries": 0,
        }
        actor_class = self.ray.remote(EngineReplica)
        plugins = plugin_choice(manager)
        self.actors = [actor_class.options(**options).remote(config, plugins) for _ in range(count)]
        self.router = PrefixRouter(count)
        self.lock = threading.RLock()
        self.latest: Any = None  # the newest weights' object ref
        self.restarts, self.sync_seconds = 0, 0.0
        self.spent = [0] * count  # restarts per replica
        self.closed = False
        what = f"{count} engine replica(s) of {config.engine!r}"
        try:
            places = self._placed_all(what)
            self.places: list[tuple[str, int] | None] = [tuple(place) for place in places]
            self.nodes = [place[0] for place in places]
            self.descriptions = self._all(lambda actor: actor.build.remote())
            self.sync_weights(model)
        except BaseException:
            self.close()
            raise

    def _placed_all(self, what: str) -> list[Any]:
        """Each replica's (node, pid) once placed; one line when it is not placed or dies starting."""
        try:
            return runtime.wait_placed(
                [actor.node.remote() for actor in self.actors],
                what,
                dict(self.ray_config.engine_resources),
                self.ray_config.start_timeout_s,
            )
        except self.ray.exceptions.RayError as exc:
            raise EngineError(f"{what} did not start: {_first_line(exc)}") from None

    # -- Engine --------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """One completion per prompt, sampled on the replicas concurrently, in prompt order."""
        sampling.validate()
        seeds = sampling.seeds_for(len(prompts))
        with self.lock:
            routes = self.router.route(prompts)
            parts: dict[int, list[int]] = {}
            for index, replica in enumerate(routes):
                parts.setdefault(replica, []).append(index)
            calls = {}
            for replica, indices in parts.items():
                asked = sampling
                if seeds is not None:
                    asked = dataclasses.replace(sampling, prompt_seeds=tuple(seeds[i] for i in indices))
                calls[replica] = ([prompts[i] for i in indices], asked)
            weights = [self.latest]  # nested: the replica gets the ref, and loads it unless it holds it
            answers = self._run(calls, lambda actor, call: actor.generate.remote(*call, weights))
            results: list[Generation | None] = [None] * len(prompts)
            for replica, indices in parts.items():
                for index, generation in zip(indices, answers[replica], strict=True):
                    results[index] = generation
                    self.router.remember(list(prompts[index]) + list(generation.token_ids), replica)
        return [generation for generation in results if generation is not None]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Put ``model``'s weights into the object store once; every replica loads them (thread-safe)."""
        start = time.perf_counter()
        with self.lock:
            self.latest = self.ray.put(pack_weights(model))
            weights = [self.latest]
            self._all(lambda actor: actor.load_weights.remote(weights))
            self.router.forget()  # new weights: the replicas' prefix caches start empty
            self.sync_seconds += time.perf_counter() - start

    def state_dict(self) -> dict[str, Any]:
        """Each replica's engine state (``replicas``: one per replica, in order)."""
        with self.lock:
            return {"replicas": self._all(lambda actor: actor.state_dict.remote())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (a state of as many replicas; anything else is ignored:
        a checkpoint of another layout samples on from each replica's own state)."""
        states = state.get("replicas")
        if not isinstance(states, list) or len(states) != len(self.actors):
            return
        with self.lock:
            self._run(dict(enumerate(states)), lambda actor, one: actor.load_state_dict.remote(one))

    @property
    def display_name(self) -> str:
        """The engine the replicas run."""
        return f"{self.config.engine} (Ray replicas)"

    @property
    def description(self) -> str:
        """``2 hf replicas on Ray: node 3f2a9c (10.0.0.3), node 8be1d0 (10.0.0.3)``."""
        nodes = ", ".join(runtime.node_label(node) for node in self.nodes)
        plural = "replica" if len(self.actors) == 1 else "replicas"
        return f"{len(self.actors)} {self.config.engine} {plural} on Ray: {nodes}"

    # -- the rest ------------------------------------------------------------------------------------
    def counts(self) -> dict[str, float]:
        """``faults/engine_restarts`` and ``perf/weight_sync_seconds`` since the last call."""
        with self.lock:
            out = {RESTARTS: float(self.restarts), SYNC_SECONDS: self.sync_seconds}
            self.restarts, self.sync_seconds = 0, 0.0
        return out

    def replica_nodes(self) -> list[str]:
        """The Ray node id of each replica (after a restart: where it runs now)."""
        return list(self.nodes)

    def close(self) -> None:
        """Kill the replicas (no restart); the engine cannot sample afterwards."""
        if self.closed:
            return
        self.closed = True
        for actor in getattr(self, "actors", []):
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone, or the cluster is
                pass

    def __del__(self) -> None:
        try:
            if getattr(self, "ray", None) is not None and self.ray.is_initialized():
                self.close()
        except Exception:  # interpreter shutdown: Ray ends the actors with the driver
            pass

    # -- calls and recovery --------------------------------------------------------------------------
    def _all(self, submit: Any) -> list[Any]:
        """``submit(actor)``'s result on every replica, in order."""
        answers = self._run({r: None for r in range(len(self.actors))}, lambda actor, _: submit(actor))
        return [answers[r] for r in range(len(self.actors))]

    def _run(self, calls: dict[int, Any], submit: Any) -> dict[int, Any]:
        """The value of ``submit(actor, call)`` (a replica method answering ``(place, value)``) for
        each replica's call, concurrently. A replica that answers from a new process was restarted
        by Ray (counted); one that dies is waited for (:meth:`_recover`) and its call made again."""
        ray = self.ray
        pending = {submit(self.actors[r], call): r for r, call in calls.items()}
        answers: dict[int, Any] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            replica = pending.pop(done[0])
            try:
                place, answers[replica] = ray.get(done[0])
                self._placed(replica, place)
            except ray.exceptions.RayActorError as exc:
                self._recover(replica, exc)
                pending[submit(self.actors[replica], calls[replica])] = replica
            except ray.exceptions.RayTaskError as exc:
                for ref in pending:
                    _cancel(ray, ref)
                raise self._task_error(replica, exc) from None
        return answers

    def _placed(self, replica: int, place: tuple[str, int]) -> None:
        """``replica`` answered from ``place`` (node id, pid): a new pid is a restart."""
        if self.places[replica] is not None and tuple(place) != self.places[replica]:
            self.restarts += 1
            self.spent[replica] += 1
        self.places[replica] = tuple(place)
        self.nodes[replica] = place[0]

    def _recover(self, replica: int, cause: BaseException) -> None:
        """Wait until ``replica`` answers again after ``cause`` (Ray restarts a dead replica; calls
        fail at once while it restarts); an EngineError naming it, its node and ``cause`` when Ray
        gave it up (its ``ray.max_restarts`` spent) or it is not back within ``ray.start_timeout_s``."""
        ray = self.ray
        limit = self.ray_config.start_timeout_s
        deadline = time.monotonic() + limit
        while True:
            try:
                self._placed(replica, ray.get(self.actors[replica].node.remote(), timeout=limit))
                return
            except ray.exceptions.ActorUnavailableError:  # restarting
                time.sleep(0.2)
            except ray.exceptions.RayActorError as again:
                cause = again
                if self.spent[replica] >= self.ray_config.max_restarts:
                    raise EngineError(
                        f"engine replica {replica} on {runtime.node_label(self.nodes[replica])} died after "
                        f"{self.spent[replica]} restart(s) (ray.max_restarts={self.ray_config.max_restarts}): "
                        f"{_first_line(cause)}"
                    ) from None
                time.sleep(0.2)
            except ray.exceptions.GetTimeoutError:
                pass
            if time.monotonic() > deadline:
                raise EngineError(
                    f"engine replica {replica} (was on {runtime.node_label(self.nodes[replica])}) was not "
                    f"back within ray.start_timeout_s={limit:g}s after: {_first_line(cause)}"
                )

    def _task_error(self, replica: int, exc: Any) -> AgentRLError:
        """The error a replica's call raised: agentrl's own as it is, anything else as an EngineError."""
        inner = getattr(exc, "cause", None)
        if isinstance(inner, AgentRLError):
            return inner
        where = runtime.node_label(self.nodes[replica]) if getattr(self, "nodes", None) else "its node"
        return EngineError(f"engine replica {replica} on {where} failed: {_first_line(inner or exc)}")


def check_engines(config: TrainConfig, ray_config: RayConfig, processes: int) -> None:
    """A ConfigError when ``ray.engines`` cannot be split over the trainer processes, or with LoRA."""
    if ray_config.engines % processes:
        raise ConfigError(
            f"ray.engines={ray_config.engines} is not a multiple of the {processes} trainer processes: "
            "each process drives the same number of engine replicas"
        )
    if config.lora is not None:
        raise ConfigError(
            "ray.engines with lora is not supported yet: the replicas load full weights; set ray.engines 0 or drop lora"
        )


def _cancel(ray: Any, ref: Any) -> None:
    try:
        ray.cancel(ref)
    except Exception:  # finished or gone: nothing to cancel
        pass


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
