"""What a run's config means once its plugins are known: the start-up checks the capability table
and the chosen algorithm make (:func:`check_startup`), every plugin settings section built
(:func:`resolve_settings`) and the whole resolved config ``--print-config`` shows (:func:`resolved_dict`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.config.capabilities import check_combination, processes_from_environment
from agentrl.config.checks import build_plugin_config
from agentrl.config.cluster import ray_options
from agentrl.config.dataset import dataset_options
from agentrl.config.lora import lora_options
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError


def check_startup(config: TrainConfig, registry: Any, processes: str | None = None) -> None:
    """Refuse a combination the capability table refuses (:mod:`agentrl.config.capabilities`;
    ``processes``: ``1``, ``n`` or ``sharded``, None: as this process was launched), and what the
    chosen algorithm cannot train: groups smaller than it compares (its class's ``min_group_size``), a
    warm-up that lasts the whole run, a policy frozen until the last step; build the engine's options
    (when its class has a ``config_class``) so they fail before any model loads."""
    check_combination(config, registry, processes or processes_from_environment())
    engine_cls = registry.get("engine", config.engine).factory
    if dataclasses.is_dataclass(getattr(engine_cls, "config_class", None)):
        build_plugin_config(engine_cls.config_class, config.engine_args, "engine_args")
    algo_cls = registry.get("algorithm", config.algo).factory
    algorithm = algo_cls(build_plugin_config(algo_cls.config_class, config.algorithm, "algorithm"))
    need = getattr(algo_cls, "min_group_size", 1)
    if config.num_generations < need:
        raise ConfigError(
            f"num_generations={config.num_generations} is too small for algorithm {config.algo!r}: it "
            f"compares the episodes of a task with each other, so it needs num_generations >= {need} "
            "(with fewer, every advantage is 0 and nothing trains)"
        )
    total = config.max_steps * algorithm.num_iterations * algorithm.num_mini_batches
    if config.warmup_steps and config.warmup_steps >= total:
        raise ConfigError(
            f"warmup_steps={config.warmup_steps} must be < the run's {total} optimizer steps "
            "(max_steps x the algorithm's epochs x mini-batches): the learning rate would never "
            "reach learning_rate"
        )
    if not algorithm.trains_policy(config.max_steps):
        raise ConfigError(
            f"algorithm {config.algo!r} with these options never updates the policy within "
            f"max_steps={config.max_steps} (e.g. a critic warm-up as long as the run)"
        )


def resolve_settings(config: TrainConfig, registry: Any) -> dict[str, Any]:
    """Every registered plugin settings section, built from ``config.plugins`` (defaults where the
    config is silent) by the class its plugin registered; an unknown section name is an error. Runs
    :func:`check_startup` first, so whatever builds a run refuses impossible combinations."""
    check_startup(config, registry)
    known = registry.names("settings")
    for name, values in config.plugins.items():
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none registered"
            raise ConfigError(f"unknown plugin settings section plugins.{name}; sections: {allowed}")
        if not isinstance(values, dict):
            raise ConfigError(f"plugins.{name} must be a mapping of options, got {values!r}")
    return {
        name: build_plugin_config(
            registry.get("settings", name).factory, config.plugins.get(name, {}), f"plugins.{name}"
        )
        for name in sorted(known)
    }


def resolved_dict(config: TrainConfig, manager: Any) -> dict[str, Any]:
    """The config as plain data with the algorithm section, every plugin settings section and the
    engine's options (when its class names a ``config_class``) filled in with their defaults, the
    rewards that will run (the env's ``default_rewards`` unless ``rewards`` names others),
    validated by their config classes: what ``--print-config`` shows."""
    data = config.to_dict()
    algo_cls = manager.registry.get("algorithm", config.algo).factory
    algo_config = build_plugin_config(algo_cls.config_class, config.algorithm, "algorithm")
    data["algorithm"] = dataclasses.asdict(algo_config)
    if config.rewards is None:  # the env's defaults are what runs: show them
        from agentrl.env import load_env_class

        env_factory = (
            load_env_class(config.env) if ":" in config.env else manager.registry.get("env", config.env).factory
        )
        data["rewards"] = dict(getattr(env_factory, "default_rewards", {}))
    data["plugins"] = {
        name: dataclasses.asdict(section) for name, section in resolve_settings(config, manager.registry).items()
    }
    if config.lora is not None:
        data["lora"] = dataclasses.asdict(lora_options(config.lora))
    for key, options in (("ray", ray_options), ("dataset", dataset_options)):
        if getattr(config, key) is not None:
            data[key] = dataclasses.asdict(options(getattr(config, key)))
    engine_cls = manager.registry.get("engine", config.engine).factory
    if dataclasses.is_dataclass(getattr(engine_cls, "config_class", None)):  # an engine that declares its options
        data["engine_args"] = dataclasses.asdict(
            build_plugin_config(engine_cls.config_class, config.engine_args, "engine_args")
        )
    return data
