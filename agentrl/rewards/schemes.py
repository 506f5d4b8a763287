"""Reward schemes: ``SCHEME:ARGUMENT`` rewards that a plugin builds with the run's context.

A plugin registers a scheme with ``agentrl_register_reward_schemes``: ``register("rm", factory)``;
``--reward rm:path/to/model[:WEIGHT]`` (or ``rewards: {"rm:path/to/model": 1.0}``) then calls
``factory(argument="path/to/model", context=RewardContext(...))`` once per run, which returns a
reward function ``fn(trajectories) -> list[float | None]``. The built-ins are ``rm`` (a learned
reward model) and ``judge`` (an LLM judge); a third party adds ``api:`` the same way.

A scheme whose argument is a local path says so when it registers: ``register("rm", factory,
path_argument=True)``, or a predicate ``path_argument=fn(argument) -> bool`` when only some of its
arguments are paths (``judge:PATH`` but not ``judge:policy``). A new run then stores such an
argument, when it names an existing relative path, as an absolute one (:func:`with_absolute_paths`),
so its ``config.yaml`` resumes from any directory.

A reward function may also have a ``pop_metrics() -> dict[str, float]`` method: the trainer logs
what it returns after each rollout as ``<label>/<key>`` (counts since the last call, e.g.
``judge/parse_failures``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError


@dataclass
class RewardContext:
    """What a reward scheme's factory may use from the run it scores for."""

    config: Any
    """The run's :class:`agentrl.config.train.TrainConfig` (``on_call_error``, ``call_timeout_s``, ...)."""
    settings: dict[str, Any]
    """Every plugin settings section, resolved (``settings["reward_model"]``)."""
    device: Any = "cpu"
    """The device the run computes on (a ``torch.device`` or its name)."""
    precision: Any = None
    """The run's :class:`agentrl.Precision` (bf16 or fp32); None: fp32."""
    columns: list[str] = field(default_factory=list)
    """The env's task columns (``question``, ``answer``, ...)."""
    tokenizer: Any = None
    """The policy's tokenizer; None until the run has loaded it (read it at call time)."""
    engine: Any = None
    """The policy's generation engine (the weights being trained, no second copy); None until the
    run has built it, so a reward reads it when called, not in its factory."""


def split_scheme(name: str, registry: Any) -> tuple[str, str] | None:
    """``(scheme, argument)`` when ``name`` is ``SCHEME:ARGUMENT`` of a registered scheme, else None."""
    scheme, sep, argument = name.partition(":")
    if not sep or scheme not in registry.names("reward_scheme"):
        return None
    if not argument:
        raise ConfigError(f"reward {name!r}: scheme {scheme!r} needs an argument ({scheme}:ARGUMENT[:WEIGHT])")
    return scheme, argument


def with_absolute_paths(config: Any, registry: Any) -> Any:
    """``config`` with each ``SCHEME:ARGUMENT`` reward whose scheme declares its argument a path
    (``path_argument``, see the module docstring) and that names an existing relative path made
    absolute; ``config`` itself when nothing changes."""
    if not config.rewards:
        return config
    rewards = {absolute_argument(name, registry): weight for name, weight in config.rewards.items()}
    return config if list(rewards) == list(config.rewards) else dataclasses.replace(config, rewards=rewards)


def absolute_argument(name: str, registry: Any) -> str:
    """``name`` with its scheme argument made absolute when the scheme declares it a path and it
    names an existing relative path; ``name`` as it is otherwise."""
    scheme = split_scheme(name, registry)
    if scheme is None:
        return name
    declared = registry.get("reward_scheme", scheme[0]).meta.get("path_argument", False)
    path = Path(scheme[1]).expanduser()
    if not (declared(scheme[1]) if callable(declared) else declared) or path.is_absolute() or not path.exists():
        return name
    return f"{scheme[0]}:{os.path.abspath(path)}"


def unknown_prefix_message(name: str, registry: Any) -> str | None:
    """The error for ``PREFIX:TEXT`` whose prefix is neither a scheme nor importable and whose text is
    not a weight (``format:heavy``); None when ``name`` may be an import spec."""
    head, sep, tail = name.rpartition(":")
    if not sep or not head.isidentifier() or _importable(head):
        return None
    schemes = ", ".join(registry.names("reward_scheme")) or "none registered"
    return (
        f"reward {name!r}: weight {tail!r} is not a number, and {head!r} is neither a reward scheme "
        f"({schemes}) nor an importable module (use NAME[:WEIGHT], SCHEME:ARGUMENT[:WEIGHT], "
        "path/file.py:func[:WEIGHT] or module:func[:WEIGHT])"
    )


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported (the current directory counts, as under ``python -m``)."""
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
