"""Reward specs to callables: registered names, ``file.py:func`` / ``module:func``, TRL-style functions.

Two signatures are accepted, told apart by their parameter names when the run starts (before any
model loads or rollout runs, so a wrong one fails in a second, not after the first rollout):

* agentrl: ``fn(trajectories) -> list[float | None]``: whole episodes (messages, tool calls, turns).
* TRL: ``fn(completions, **kwargs)`` or ``fn(prompts, completions, **kwargs)`` (sync or ``async``),
  exactly as written for ``trl.GRPOTrainer``: every task column (``answer``, ``solution``, ...) comes
  as a keyword argument holding one value per sample, and ``completion_ids`` holds the sampled
  token ids. Completions are conversational by default (``[{"role": "assistant", "content": ...}]``
  plus, in multi-turn episodes, every later message) and plain strings (the final reply) with
  ``reward_completion_format: plain``; prompts likewise (the opening messages, or the text of the
  last opening user message). ``None`` marks a sample the function does not score.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.errors import ConfigError, PluginError, RewardError
from agentrl.imports import load_object
from agentrl.rewards.schemes import (
    RewardContext,
    bare_folder,
    split_scheme,
    unknown_prefix_message,
    unknown_reward_message,
)
from agentrl.rewards.scoring import RewardFn
from agentrl.trajectory import Trajectory

COMPLETION_FORMATS = ("conversational", "plain")
SIGNATURES = (
    "fn(trajectories) -> list[float | None] (agentrl: whole episodes)",
    "fn(completions, **kwargs) or fn(prompts, completions, **kwargs) (TRL: task columns as "
    "keyword arguments; sync or async)",
)
_PROVIDED = ("prompts", "completions", "completion_ids")


def is_import_spec(name: str) -> bool:
    """True for ``path/file.py:func`` or ``package.module:func`` (a function to import, not a name)."""
    return ":" in name


def reward_style(fn: Callable[..., Any], name: str) -> str:
    """``"agentrl"`` or ``"trl"`` from ``fn``'s parameter names; a RewardError naming both otherwise."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise RewardError(
            f"reward {name!r} is not a function ({type(fn).__name__}); accepted: " + "; ".join(SIGNATURES)
        ) from None
    if "trajectories" in params:
        return "agentrl"
    if "completions" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return "trl"
    shown = f"{getattr(fn, '__name__', type(fn).__name__)}{inspect.signature(fn)}"
    raise RewardError(f"reward {name!r} has signature {shown}; accepted: " + "; ".join(SIGNATURES))


def check_trl_parameters(fn: Callable[..., Any], name: str, columns: Sequence[str]) -> None:
    """Every required parameter of a TRL-style ``fn`` is something the run provides."""
    available = set(_PROVIDED) | set(columns)
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL) or param.default is not param.empty:
            continue
        if param.name not in available:
            raise RewardError(
                f"reward {name!r} needs an argument {param.name!r} that this env's tasks do not have; "
                f"available: {', '.join(sorted(available))}"
            )


class TRLReward:
    """Wraps a TRL-style reward function as ``fn(trajectories) -> list[float | None]``."""

    def __init__(self, fn: Callable[..., Any], name: str, completion_format: str = "conversational") -> None:
        if completion_format not in COMPLETION_FORMATS:
            raise ConfigError(f"reward_completion_format {completion_format!r} is not one of {COMPLETION_FORMATS}")
        self.fn, self.name, self.completion_format = fn, name, completion_format
        params = inspect.signature(fn).parameters
        self._takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
        self._accepted = set(params)

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        kwargs: dict[str, Any] = {
            "prompts": [self._prompt(t) for t in trajectories],
            "completions": [self._completion(t) for t in trajectories],
            "completion_ids": [
                [tok for turn in t.turns for tok in t.token_ids[turn.start : turn.end]] for t in trajectories
            ],
        }
        for column in dict.fromkeys(key for t in trajectories for key in t.task):
            if column not in kwargs:
                kwargs[column] = [t.task.get(column) for t in trajectories]
        if not self._takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self._accepted}
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = _await(result)
        return list(result) if not isinstance(result, list) and hasattr(result, "__iter__") else result

    def _prompt(self, trajectory: Trajectory) -> Any:
        opening = trajectory.messages[: _completion_start(trajectory)]
        if self.completion_format == "conversational":
            return opening
        users = [m for m in opening if m.get("role") == "user"]
        return str(users[-1].get("content") or "") if users else ""

    def _completion(self, trajectory: Trajectory) -> Any:
        if self.completion_format == "conversational":
            # An episode with no reply (the prompt filled the budget) gets one empty assistant
            # message, as TRL gives an empty completion: ``completion[-1]["content"]`` stays valid.
            return trajectory.messages[_completion_start(trajectory) :] or [{"role": "assistant", "content": ""}]
        return trajectory.completion_text


def _completion_start(trajectory: Trajectory) -> int:
    """Index in ``messages`` of the model's first reply (every turn appended one assistant message;
    counted from the end, so assistant messages in a few-shot prompt stay in the prompt)."""
    remaining = len(trajectory.turns)
    if remaining == 0:
        return len(trajectory.messages)
    for index in range(len(trajectory.messages) - 1, -1, -1):
        if trajectory.messages[index].get("role") == "assistant":
            remaining -= 1
            if remaining == 0:
                return index
    return len(trajectory.messages)


def _await(awaitable: Any) -> Any:
    """Run an async reward's coroutine to completion (in a daemon thread if a loop is running: a
    reward that never finishes is abandoned with the call guard's thread, never joined at exit)."""

    async def wrapped() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrapped())
    outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def target() -> None:
        try:
            outcome.set_result(asyncio.run(wrapped()))
        except BaseException as exc:  # handed to the caller
            outcome.set_exception(exc)

    threading.Thread(target=target, name="agentrl-async-reward", daemon=True).start()
    return outcome.result()


def find_reward(name: str, registry: Any) -> tuple[Callable[..., Any], str]:
    """(function, ``"agentrl"`` or ``"trl"``) for reward ``name``, a registered name or an import
    spec, or (the scheme's factory, ``"scheme"``) for ``SCHEME:ARGUMENT`` or a bare folder a scheme
    takes (:func:`~agentrl.rewards.schemes.bare_folder`): the error for an unknown name (listing
    every form), a missing file or a wrong signature, without an env or a model (``--print-config``
    checks the rewards with it)."""
    scheme = split_scheme(bare_folder(name, registry) or name, registry)
    if scheme is not None:
        return registry.get("reward_scheme", scheme[0]).factory, "scheme"
    refused = unknown_prefix_message(name, registry)
    if refused is not None:
        raise ConfigError(refused)
    if is_import_spec(name):
        fn = load_object(name, "reward")
    elif name in registry.names("reward"):
        fn = registry.get("reward", name).factory
    else:
        raise PluginError(unknown_reward_message(name, registry))
    return fn, reward_style(fn, name)


def load_reward(
    name: str,
    registry: Any,
    columns: Sequence[str],
    completion_format: str = "conversational",
    context: RewardContext | None = None,
) -> RewardFn:
    """The callable for reward ``name`` (registered name, import spec or ``SCHEME:ARGUMENT``, whose
    factory gets ``context``), adapted to the agentrl signature and checked against the env's task
    ``columns``."""
    fn, style = find_reward(name, registry)
    if style == "scheme":
        if context is None:
            raise ConfigError(f"reward {name!r} is built by a reward scheme, which needs the run's context")
        return fn(argument=split_scheme(bare_folder(name, registry) or name, registry)[1], context=context)
    if style == "agentrl":
        return fn
    check_trl_parameters(fn, name, columns)
    return TRLReward(fn, name, completion_format)


def reward_label(name: str, taken: Sequence[str] = (), scheme: str | None = None) -> str:
    """The name a reward's metrics go by: its own name, a scheme's name (``reward/rm_mean``) or a spec's
    function name (``reward/func_mean``) unless another reward already has that label."""
    label = scheme or (name.rpartition(":")[2] if is_import_spec(name) else name)
    return label if label not in taken else name


def resolve_rewards(
    config: Any, registry: Any, env: Any, context: RewardContext | None = None
) -> dict[str, tuple[RewardFn, float]]:
    """The run's reward functions with weights by label: ``config.rewards``, else the env's
    ``default_rewards``. A ``SCHEME:ARGUMENT`` reward is built with ``context`` (default: the
    config's settings sections on the CPU; its ``columns`` are filled in from the env). A bare folder
    a scheme takes is built and labelled as ``SCHEME:FOLDER``."""
    chosen = config.rewards if config.rewards is not None else dict(env.default_rewards)
    chosen = {bare_folder(name, registry) or name: weight for name, weight in chosen.items()}
    tasks = env.train_tasks()
    columns = sorted(tasks[0]) if len(tasks) else []
    if context is None and any(split_scheme(name, registry) for name in chosen):
        from agentrl.config.startup import resolve_settings

        context = RewardContext(config=config, settings=resolve_settings(config, registry))
    if context is not None:
        context.columns = columns
    resolved: dict[str, tuple[RewardFn, float]] = {}
    for name, weight in chosen.items():
        fn = load_reward(name, registry, columns, config.reward_completion_format, context)
        scheme = split_scheme(name, registry)
        resolved[reward_label(name, [*resolved, "env", "total"], scheme and scheme[0])] = (fn, float(weight))
    return resolved
