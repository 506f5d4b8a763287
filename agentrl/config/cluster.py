"""The ``ray`` section of the run config: :class:`RayConfig`, where each role of a run on a Ray
cluster runs and how many of it (no ray import here; :mod:`agentrl.cluster` acts on it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from agentrl.config.checks import ConfigCheck, build_plugin_config
from agentrl.config.rules import Allowed

Resources = Annotated[
    dict[str, Annotated[float, Field(ge=0)]],
    Allowed("a mapping of Ray resource names to amounts >= 0, e.g. {CPU: 1, GPU: 1} or {CPU: 1, env_node: 1}"),
]


@dataclass(frozen=True)
class RayConfig:
    """Options of a run on a Ray cluster (the ``ray`` section; ``agentrl train --ray`` sets ``{}``)."""

    address: str | None = None
    """The cluster to join: ``HOST:PORT`` of its head (what ``ray start --head`` prints), ``auto``
    for the one this machine joined with ``ray start``; null: ``RAY_ADDRESS`` when set, else the
    cluster started on this machine, else a new one-machine cluster for this run."""
    trainer_resources: Resources = field(default_factory=lambda: {"CPU": 1})
    """What each trainer process holds (``--num-processes N``: N of them; process 0 runs where
    ``agentrl train`` runs and writes the run dir, the others go wherever these fit). ``GPU: 1`` on
    GPU nodes; a custom resource (``ray start --resources '{"trainer": 1}'``) picks nodes."""
    engines: Annotated[int, Field(ge=0)] = 0
    """Engine replicas as Ray actors (the config's ``engine``, each with its own copy of the
    weights, sent after every update); a multiple of the trainer processes, each driving its share.
    0: each trainer process samples in itself, as on one host."""
    engine_resources: Resources = field(default_factory=lambda: {"CPU": 1})
    """What each engine replica holds (``GPU: 1`` for a vLLM replica on a GPU node)."""
    env_workers: Annotated[int, Field(ge=0)] = 0
    """Env worker actors running the envs' ``reset``/``step`` (and the ``openai_agent`` rollout's agent
    programs); a multiple of the trainer processes. 0: in the trainer processes, as on one host."""
    env_worker_resources: Resources = field(default_factory=lambda: {"CPU": 1})
    """What each env worker holds (a custom resource puts them on CPU-only nodes)."""
    env_worker_slots: Annotated[int, Field(ge=1)] | None = None
    """How many env calls one env worker makes at once (the sandboxes or browsers its node holds);
    more wait their turn there. null: ``env_workers``, the run's concurrent env calls."""
    max_restarts: Annotated[int, Field(ge=0)] = 3
    """How many times a dead engine replica or env worker is restarted; its calls are made again
    (an env's episode replayed from its seed and actions), so the step ends with the same tokens."""
    start_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    """How long the run waits for the cluster to place a role (resources that no node has, a
    trainer process that cannot join the group) before it stops with one line saying which."""
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """Ray's runtime environment for every actor (``pip``, ``env_vars``, ``working_dir``); agentrl
    adds this process's import path, so code importable here imports on a node of the same machine."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        check = ConfigCheck(self, "ray")
        check.declared()
        if self.address is not None and not self.address.strip():
            check.fail("address", "expected HOST:PORT, 'auto' or null")


def ray_options(values: dict[str, Any] | None) -> RayConfig | None:
    """The validated ``ray`` section; None (one host, no Ray) when it is null."""
    return None if values is None else build_plugin_config(RayConfig, values, "ray")
