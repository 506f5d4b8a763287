"""Joining (or starting) the Ray cluster of a run, and what every role's actors share: options from
a resources mapping, the runtime environment, waiting for an actor to be placed, node labels."""

from __future__ import annotations

import os
import sys
from typing import Any

from agentrl.config.cluster import RayConfig
from agentrl.errors import ConfigError

FAULTS = "faults/"
"""Prefix of the metrics that count restarts and calls made again (``faults/engine_restarts``...)."""


def require_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray section needs Ray: pip install 'agentrl[ray]'") from None
    return ray


def import_path() -> str:
    """This process's import path as ``PYTHONPATH``: actors on this machine import what it imports
    (plugins from a source tree, an env file's folder); other machines need them installed."""
    return os.pathsep.join(entry for entry in sys.path if entry and os.path.isdir(entry))


def runtime_env(config: RayConfig) -> dict[str, Any]:
    """The config's runtime environment with this process's import path added to ``PYTHONPATH``
    and single-threaded math libraries unless the config sets them."""
    env = dict(config.runtime_env)
    env_vars = {"PYTHONPATH": import_path(), **dict(env.get("env_vars", {}))}
    env["env_vars"] = env_vars
    return env


def connect(config: RayConfig, local_cpus: float = 0) -> Any:
    """Join the config's cluster (module docstring of :class:`RayConfig.address`), once per process;
    a new local cluster gets at least ``local_cpus`` logical CPUs (the roles' sum: Ray's CPUs are an
    account, not cores). Returns the ``ray`` module."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    options: dict[str, Any] = {
        "runtime_env": runtime_env(config),
        "logging_level": "WARNING",
        "log_to_driver": True,
        "include_dashboard": False,
    }
    address = config.address or os.environ.get("RAY_ADDRESS")
    if address is None and not _cluster_on_this_machine():
        options["num_cpus"] = max(os.cpu_count() or 1, local_cpus)
    try:
        ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"ray.address={address!r}: cannot join that cluster ({_first_line(exc)})") from None
    return ray


def _cluster_on_this_machine() -> bool:
    """Whether ``ray start`` left a cluster on this machine for ``ray.init()`` to join."""
    from ray._private.utils import read_ray_address

    return bool(read_ray_address())


def actor_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray actor options holding ``resources`` (``CPU`` and ``GPU`` as ``num_cpus``/``num_gpus``,
    the rest as custom resources)."""
    rest = {name: amount for name, amount in resources.items() if name not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0), "resources": rest}


def wait_placed(ready: list[Any], what: str, resources: dict[str, float], timeout_s: float) -> list[Any]:
    """The results of ``ready`` (each actor's first call); a ConfigError naming ``what``, its
    resources and what the cluster has when they are not placed within ``timeout_s``."""
    ray = require_ray()
    try:
        return ray.get(ready, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        for ref in ready:
            ray.cancel(ref)  # actor calls: Ray refuses force=True for them
        raise ConfigError(
            f"ray: {what} needing {resources} not placed within {timeout_s:g}s: the cluster has "
            f"{_resources_text(ray.cluster_resources())} in all, {_resources_text(ray.available_resources())} free "
            "(lower the resources, add nodes, or raise ray.start_timeout_s)"
        ) from None


def node_id() -> str:
    """The id of the Ray node this process runs on."""
    return require_ray().get_runtime_context().get_node_id()


def node_label(node: str) -> str:
    """A short label for a node id (``node 3f2a9c``), with ``head`` for the head node."""
    ray = require_ray()
    for info in ray.nodes():
        if info.get("NodeID") == node:
            head = " head" if info.get("Resources", {}).get("node:__internal_head__") else ""
            return f"node {node[:6]}{head} ({info.get('NodeManagerAddress', '?')})"
    return f"node {node[:6]}"


def _resources_text(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in sorted(resources.items()) if not k.startswith(("node:", "memory", "object_store"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
