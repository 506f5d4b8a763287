"""Building envs: an env class from ``file.py:Class`` / ``module:Class``, an instance from its
factory and ``env_args``, the agentrl Env inside an env, class or factory, and the built-in envs'
gymnasium ids."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import gymnasium

from agentrl.env.base import Env
from agentrl.errors import AgentRLError, ConfigError, EnvError, one_line
from agentrl.faults import plugin_exit
from agentrl.imports import load_object

GYMNASIUM_IDS = {
    "agentrl/Math-v0": "agentrl_math:MathEnv",
    "agentrl/Calculator-v0": "agentrl_tool_envs:CalculatorEnv",
    "agentrl/Python-v0": "agentrl_tool_envs:PythonEnv",
    "agentrl/Guess-v0": "agentrl_guess:GuessEnv",
}
"""gymnasium id -> entry point of each built-in env registered with gymnasium."""


def _keywords(signature: inspect.Signature) -> str:
    """The keyword arguments ``signature`` accepts, in words (``**kwargs`` said as "any other")."""
    named = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    words = ", ".join(named) if named else "no named arguments"
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        words += " (and any other, passed on)"
    return words


def build_env(factory: Callable[..., Any], env_args: dict[str, Any], name: str) -> Any:
    """``factory(**env_args)``: the env ``name`` (as ``--env`` gave it) built. ``env_args`` that do not
    fit its signature are a ConfigError; anything its constructor raises (SystemExit included) is an
    EnvError naming the env and the cause in one line; an AgentRLError it raises passes unchanged."""
    try:
        signature = inspect.signature(factory)
    except ValueError:
        signature = None  # no signature to check: the call itself says
    if signature is not None:
        try:
            signature.bind(**env_args)
        except TypeError as exc:
            raise ConfigError(
                f"env_args {env_args!r} do not fit env {name!r}: {exc}; it takes {_keywords(signature)}"
            ) from None
    try:
        return factory(**env_args)
    except AgentRLError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        failure = exc if isinstance(exc, Exception) else plugin_exit(exc)
        if failure is None:  # a real Ctrl-C
            raise
        arguments = ", ".join(f"{key}={value!r}" for key, value in env_args.items())
        call = f"{getattr(factory, '__qualname__', type(factory).__name__)}({arguments})"
        raise EnvError(f"env {name!r} failed to start: {call} raised {one_line(failure)}") from exc


def load_env_class(spec: str) -> type[Env]:
    """Load an Env subclass from ``path/to/file.py:ClassName`` or ``package.module:ClassName``
    (the file is imported once, as a real module, so dataclasses and pickling work in it)."""
    if ":" not in spec:
        raise EnvError(f"env spec {spec!r} must look like 'file.py:ClassName' or 'module:ClassName'")
    try:
        cls = load_object(spec, "env")
    except ConfigError as exc:
        raise EnvError(str(exc)) from exc.__cause__
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        where, _, class_name = spec.rpartition(":")
        raise EnvError(f"{spec!r}: {class_name!r} is not an agentrl.Env subclass in {where!r}")
    return cls


def unwrapped_env(env_factory_or_env: Any, caller: str) -> Env:
    """The agentrl Env inside an env instance (wrapped by ``gymnasium.make`` or not), an Env class
    or a zero-argument factory; an EnvError, naming ``caller``, for anything else."""
    if isinstance(env_factory_or_env, gymnasium.Env):
        env = env_factory_or_env
    elif callable(env_factory_or_env):
        env = env_factory_or_env()
    else:
        raise EnvError(f"{caller} needs an env, an Env class or a factory, got {env_factory_or_env!r}")
    if not isinstance(env, gymnasium.Env):
        raise EnvError(f"{caller}: the factory returned {type(env).__name__}, not a gymnasium.Env")
    inner = env.unwrapped
    if not isinstance(inner, Env):
        raise EnvError(f"{type(inner).__name__} is not an agentrl.Env subclass")
    return inner


def register_gymnasium_envs() -> None:
    """Register the built-in envs with gymnasium (its ``gymnasium.envs`` entry point calls this)."""
    for env_id, entry_point in GYMNASIUM_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point, disable_env_checker=True)
