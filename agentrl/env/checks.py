"""Checks of what an env returns (messages, rewards, flags, info), each raising a one-line EnvError
that names the env, the method, what it returned and the shape expected."""

from __future__ import annotations

import math
import numbers
import reprlib
from typing import Any

import gymnasium
import numpy as np

from agentrl.errors import EnvError

Message = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")
MESSAGES_SHAPE = "a list of {'role': 'system'|'user'|'assistant'|'tool', 'content': str} dicts"
"""The shape ``start`` and ``respond`` must give their messages in (for error messages)."""

MAX_ABS_REWARD = 1e9
"""The largest reward magnitude a run takes (from an env step or a weighted reward function).
Training math runs in float32 (rewards in the batch, the loss, PPO's squared value error); within
±1e9, sums and squares stay far from float32's 3.4e38, and a larger value is almost always a unit
bug or a sentinel (``sys.float_info.max`` for "never"). A bigger one stops the run naming where it
came from, instead of overflowing into a step skipped as unscored."""

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 4


def short_repr(value: Any) -> str:
    """``repr(value)`` cut short (strings at 60 characters, containers at 4 items) for messages."""
    return _REPR.repr(value)


def describe(value: Any) -> str:
    """A short description of ``value`` for error messages: "a str 'abc'", "a tuple of 3 values"."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} value{'s' if len(value) != 1 else ''}"
    if isinstance(value, (str, bytes, numbers.Number, list, dict)):
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} {short_repr(value)}"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def check_messages(where: str, messages: Any, non_empty: bool) -> None:
    """Raise EnvError unless ``messages`` (returned by ``where``, e.g. ``"MyEnv.start"``) is a
    list of well-formed chat messages (at least one when ``non_empty``)."""
    if not isinstance(messages, list):
        raise EnvError(f"{where} must return its messages as {MESSAGES_SHAPE}; got {describe(messages)}")
    if non_empty and not messages:
        raise EnvError(f"{where} must return at least one message ({MESSAGES_SHAPE}); got []")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            problem = f"is {describe(message)}, not a dict"
        elif message.get("role") not in ROLES:
            problem = f"has role {message.get('role')!r}; allowed: {', '.join(ROLES)}"
        elif "content" not in message:
            problem = f"has no 'content' (a str): {short_repr(message)}"
        elif not isinstance(message["content"], str):
            problem = f"has content {describe(message['content'])}; it must be a str"
        else:
            continue
        raise EnvError(f"{where}: message {i} {problem} (expected {MESSAGES_SHAPE})")


def check_reward(where: str, reward: Any, position: str) -> None:
    """Raise EnvError unless ``reward`` (the ``position`` value ``where`` returned) is a finite
    real number within ±:data:`MAX_ABS_REWARD`."""
    if not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise EnvError(
            f"{where} must return a finite number as its reward ({position} value); got "
            f"{describe(reward)} (an env that cannot score an episode should raise)"
        )
    if abs(reward) > MAX_ABS_REWARD:
        raise EnvError(
            f"{where} returned reward {float(reward):g} ({position} value): rewards must be within "
            f"±{MAX_ABS_REWARD:g} (training runs in float32; larger values overflow it): rescale it"
        )


def check_flag(where: str, flag: Any, name: str, position: str) -> None:
    """Raise EnvError unless ``flag`` (``terminated`` or ``truncated``) is a bool."""
    if not isinstance(flag, (bool, np.bool_)):
        raise EnvError(f"{where} must return a bool as {name} ({position} value); got {describe(flag)}")


def check_info(where: str, info: Any, position: str) -> None:
    """Raise EnvError unless ``info`` is a dict."""
    if not isinstance(info, dict):
        raise EnvError(f"{where} must return a dict as info ({position} value); got {describe(info)}")


def check_reset_result(env: gymnasium.Env, result: Any) -> tuple[list[Message], dict[str, Any]]:
    """``result`` of ``env.reset`` as ``(messages, info)``; EnvError naming the env, the method,
    what it returned and the expected shape otherwise (an env overriding ``reset`` included)."""
    where = f"{type(env).__name__}.reset"
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvError(f"{where} must return (messages, info); got {describe(result)}")
    messages, info = result
    check_messages(where, messages, non_empty=True)
    check_info(where, info, "2nd")
    return messages, info


def check_step_result(env: gymnasium.Env, result: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
    """``result`` of ``env.step`` as ``(messages, reward, terminated, truncated, info)``; EnvError
    naming the env, the method, what it returned and the expected shape otherwise."""
    where = f"{type(env).__name__}.step"
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvError(f"{where} must return (messages, reward, terminated, truncated, info); got {describe(result)}")
    messages, reward, terminated, truncated, info = result
    check_messages(where, messages, non_empty=False)
    check_reward(where, reward, "2nd")
    check_flag(where, terminated, "terminated", "3rd")
    check_flag(where, truncated, "truncated", "4th")
    check_info(where, info, "5th")
    return messages, float(reward), bool(terminated), bool(truncated), info
