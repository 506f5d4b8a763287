"""``TrainConfig``: every knob of a run, validated when it is built.

The docstring under each field is the only help text (``agentrl train --print-config`` shows
the resolved whole). Sections owned by plugins (``algorithm``, ``env_args``, ``engine_args`` and each entry of
``plugins``) are plain dicts here and validated by the plugin's own config class at start-up.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from agentrl.errors import ConfigError
from agentrl.imports import absolute_spec


@dataclass(frozen=True)
class TrainConfig:
    """Configuration of one training run (YAML file + CLI flags + ``--set key=value``)."""

    model: str = "smollm2-135m"
    """Local HF folder, run dir, hub id, or alias (``smollm2-135m``: the embedded default)."""
    env: str = "math"
    """Environment name (``agentrl plugins`` lists them) or ``path/to/file.py:ClassName``."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment's constructor."""
    algo: str = "grpo"
    """Algorithm name."""
    algorithm: dict[str, Any] = field(default_factory=dict)
    """Options of the algorithm (validated by its config class, e.g. GRPOConfig)."""
    engine: str = "hf"
    """Generation engine name."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Options of the engine (e.g. ``dtype: bfloat16``)."""
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Settings of step-hook plugins, one section per plugin (``plugins.sampler_correction.mode:
    tis``); each plugin registers and validates its own section, ``--print-config`` lists them all
    with their defaults. A step-hook plugin does nothing unless its section turns it on."""
    rollout: str = "multi_turn"
    """Rollout function name (multi_turn also covers single-turn envs)."""
    rewards: dict[str, float] | None = None
    """Reward functions (registered names, ``file.py:func`` or ``module:func``; agentrl- or
    TRL-style) and their weights, added to the env's own reward. None: the env's
    ``default_rewards``; a mapping replaces them (list them again to keep them)."""
    reward_completion_format: str = "conversational"
    """What TRL-style reward functions receive as ``completions`` and ``prompts``: ``conversational``
    (message lists, as TRL gives for chat datasets) or ``plain`` (the final reply's text; the last
    opening user message's text)."""
    env_reward_weight: float = 1.0
    """Weight of the environment's own reward (its per-turn rewards summed)."""

    max_steps: int = 40
    """Optimizer steps (one rollout batch each, times ``num_iterations``)."""
    prompts_per_step: int = 4
    """Tasks sampled per step; each is rolled out ``num_generations`` times."""
    num_generations: int = 8
    """Group size: episodes per task (GRPO needs >= 2)."""
    max_new_tokens: int = 64
    """Cap on tokens the model samples in one turn."""
    max_sampled_tokens: int | None = None
    """Cap on tokens the model samples over an episode (None: max_new_tokens x env max_turns);
    also Dr. GRPO's normalising constant."""
    max_total_tokens: int = 2048
    """Cap on a whole episode's tokens (prompt, sampled, env); reaching it truncates."""
    temperature: float = 1.0
    """Sampling temperature; trainer logprobs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""

    learning_rate: float = 2e-5
    """AdamW peak learning rate."""
    lr_scheduler: str = "constant"
    """``constant``, ``linear`` (decay to 0) or ``cosine``; after ``warmup_steps``."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this (None: no clipping)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward at most; a step accumulates over all its micro-batches."""
    micro_batch_tokens: int = 4096
    """Padded tokens per forward/backward at most (rows x longest row): long multi-turn episodes
    go fewer to a micro-batch, which bounds activation memory (about 1.8 MB per token for the
    default model in bf16 autocast). A row longer than this goes alone."""
    precision: str = "bf16"
    """``bf16`` (autocast, fp32 master weights; fast on CPUs with AMX/AVX512-BF16) or ``fp32``."""
    mask_truncated_completions: bool = False
    """Drop episodes cut by a length/turn limit from the loss (DAPO overlong filtering)."""

    seed: int = 0
    """Seed for model init, task order and sampling."""
    output_dir: str | None = None
    """Run directory (None: ``runs/<env>-<algo>-<timestamp>``)."""
    eval_tasks: int = 64
    """Held-out tasks evaluated before and after training (0: skip evaluation)."""
    eval_every: int = 10
    """Also evaluate every this many steps (0: only before and after)."""
    eval_temperature: float = 0.0
    """Temperature for evaluation (0: greedy)."""
    eval_sampled: bool = True
    """Also report accuracy at the training temperature (``eval/accuracy_sampled``)."""
    log_completions_every: int = 10
    """Write sampled conversations to ``completions.jsonl`` every this many steps (0: never)."""
    save_model: bool = True
    """Save the trained policy to ``<run_dir>/model`` at the end."""

    def __post_init__(self) -> None:
        _check_types(self)
        positive = ("max_steps", "prompts_per_step", "num_generations", "max_new_tokens",
                    "max_total_tokens", "micro_batch_size", "micro_batch_tokens")
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)!r}")
        for key in ("eval_tasks", "eval_every", "warmup_steps", "log_completions_every", "top_k"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if self.max_sampled_tokens is not None and self.max_sampled_tokens < 1:
            raise ConfigError(f"max_sampled_tokens must be >= 1 or null, got {self.max_sampled_tokens!r}")
        if self.temperature < 0 or self.eval_temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.temperature == 0:
            raise ConfigError("temperature must be > 0 for training (greedy samples give identical groups)")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if self.lr_scheduler not in ("constant", "linear", "cosine"):
            raise ConfigError(
                f"lr_scheduler must be one of constant, linear, cosine; got {self.lr_scheduler!r}"
            )
        if self.precision not in ("bf16", "fp32"):
            raise ConfigError(f"precision must be 'bf16' or 'fp32', got {self.precision!r}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"max_grad_norm must be > 0 or null, got {self.max_grad_norm!r}")
        if self.rewards is not None:
            for name, weight in self.rewards.items():
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                    raise ConfigError(f"rewards.{name} must be a finite number, got {weight!r}")
        if self.reward_completion_format not in ("conversational", "plain"):
            raise ConfigError("reward_completion_format must be 'conversational' or 'plain', got "
                              f"{self.reward_completion_format!r}")
        object.__setattr__(self, "env", absolute_spec(self.env))  # frozen: set once, here
        if self.rewards is not None:
            object.__setattr__(self, "rewards", {absolute_spec(name): w for name, w in self.rewards.items()})
        if not math.isfinite(self.env_reward_weight):
            raise ConfigError(f"env_reward_weight must be a finite number, got {self.env_reward_weight!r}")

    @property
    def batch_size(self) -> int:
        """Episodes per step: prompts_per_step x num_generations."""
        return self.prompts_per_step * self.num_generations

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (for YAML and the run dir)."""
        data = dataclasses.asdict(self)
        data["adam_betas"] = list(self.adam_betas)
        return data


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` as a float (YAML 1.1 wants ``1.0e-5``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML text with the float rule above."""
    return yaml.load(text, Loader=_Loader)


def _check_types(config: TrainConfig) -> None:
    hints = get_type_hints(TrainConfig)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        expected = hints[f.name]
        if not _matches(value, expected):
            raise ConfigError(f"{f.name} must be {_type_name(expected)}, got {value!r}")


def _matches(value: Any, expected: Any) -> bool:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict)
    if origin is tuple:
        return isinstance(value, (tuple, list)) and len(value) == len(args)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True


def _type_name(expected: Any) -> str:
    return getattr(expected, "__name__", None) or str(expected).replace("typing.", "")


def field_names() -> list[str]:
    """All TrainConfig keys."""
    return [f.name for f in dataclasses.fields(TrainConfig)]


def build_config(file: str | Path | None = None, overrides: dict[str, Any] | None = None,
                 sets: list[str] | None = None) -> TrainConfig:
    """File values, then ``sets`` (``key=value``, YAML-parsed, dotted keys into dict sections),
    then ``overrides`` (CLI flags that were given); unknown keys are errors."""
    data: dict[str, Any] = {}
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise ConfigError(f"config file {str(file)!r} does not exist")
        try:
            loaded = load_yaml(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(file)!r} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(file)!r} must hold a mapping, got {type(loaded).__name__}")
        data.update(loaded)
    for item in sets or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        _set_dotted(data, key.strip(), load_yaml(raw))
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    known = set(field_names())
    for key in data:
        if key not in known:
            import difflib

            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}")
    if isinstance(data.get("adam_betas"), list):
        data["adam_betas"] = tuple(data["adam_betas"])
    return TrainConfig(**data)


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    head, _, rest = key.partition(".")
    if not rest:
        data[head] = value
        return
    section = data.setdefault(head, {})
    if not isinstance(section, dict):
        raise ConfigError(f"--set {key}: {head!r} is not a section")
    _set_dotted(section, rest, value)


def build_plugin_config(config_class: type[Any], values: dict[str, Any], section: str) -> Any:
    """Instantiate a plugin's config dataclass from a dict, naming unknown keys and the section."""
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in {section}; "
            f"{config_class.__name__} accepts: {', '.join(sorted(known))}"
        )
    return config_class(**values)


def resolve_settings(config: TrainConfig, registry: Any) -> dict[str, Any]:
    """Every registered plugin settings section, built from ``config.plugins`` (defaults where the
    config is silent) by the class its plugin registered; an unknown section name is an error."""
    known = registry.names("settings")
    for name, values in config.plugins.items():
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none registered"
            raise ConfigError(f"unknown plugin settings section plugins.{name}; sections: {allowed}")
        if not isinstance(values, dict):
            raise ConfigError(f"plugins.{name} must be a mapping of options, got {values!r}")
    return {name: build_plugin_config(registry.get("settings", name).factory, config.plugins.get(name, {}),
                                      f"plugins.{name}")
            for name in sorted(known)}


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

        env_factory = (load_env_class(config.env) if ":" in config.env
                       else manager.registry.get("env", config.env).factory)
        data["rewards"] = dict(getattr(env_factory, "default_rewards", {}))
    data["plugins"] = {name: dataclasses.asdict(section)
                       for name, section in resolve_settings(config, manager.registry).items()}
    engine_cls = manager.registry.get("engine", config.engine).factory
    if dataclasses.is_dataclass(getattr(engine_cls, "config_class", None)):  # an engine that declares its options
        data["engine_args"] = dataclasses.asdict(build_plugin_config(engine_cls.config_class, config.engine_args,
                                                                     "engine_args"))
    return data
