"""Checks of what an env returns (messages, rewards, flags, info), each raising a one-line EnvError
that names the env, the method, what it returned and the shape expected."""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np

from agentrl.env.calls import call_with_timeout
from agentrl.errors import EnvError, one_line

Message = dict[str, Any]

GoldReply = str | Sequence[str] | Callable[[list[Message]], str] | None
"""What ``Env.gold_reply(task)`` returns: one reply (a str), the replies of a multi-turn episode
(a list, one per assistant turn), a function that plays the episode (given the conversation so
far, the messages of ``reset`` and of every turn, it returns the next reply), or None (no gold)."""

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


@dataclass
class GoldEpisode:
    """A gold episode played through an env's ``reset``/``step``: each turn's reply, the env's
    messages and reward, and how it ended."""

    env: str
    task: Any
    replies: list[str] = field(default_factory=list)
    answers: list[list[Message]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    ended: str = ""
    """``"terminated"``, ``"truncated"`` or ``""`` (the replies ran out first)."""

    @property
    def total(self) -> float:
        """The episode's return: the sum of its turns' rewards."""
        return sum(self.rewards)

    def transcript(self) -> str:
        """The turns on one line: ``turn 1 replied '...' -> tool '2' (reward 0); ...``."""
        turns = []
        for n, (reply, answer, reward) in enumerate(zip(self.replies, self.answers, self.rewards), 1):
            said = ", ".join(f"{m.get('role')} {short_repr(m.get('content'))}" for m in answer) or "nothing"
            turns.append(f"turn {n} replied {short_repr(reply)} -> {said} (reward {reward:g})")
        return "; ".join(turns)

    def check_return(self, max_reward: float) -> None:
        """Raise EnvError unless the episode's return is ``max_reward``, naming its last turn."""
        if math.isclose(self.total, max_reward, abs_tol=1e-6):
            return
        if len(self.replies) == 1:
            raise EnvError(
                f"{self.env}: the gold reply {self.replies[0]!r} earned {self.total!r}, expected the max "
                f"reward {max_reward!r} (task {self.task!r})"
            )
        problem = f"ends it with return {self.total:g}, expected the max reward {max_reward!r}"
        raise self.fail(len(self.replies), f"{problem}: {self.transcript()}")

    def fail(self, turn: int, problem: str) -> EnvError:
        """An EnvError naming the env, the task and the turn of the gold episode."""
        task = short_repr(self.task.get("id", self.task.get("question")) if isinstance(self.task, dict) else self.task)
        return EnvError(f"{self.env}: turn {turn} of the gold episode (task {task}) {problem}")


def play_gold_episode(env: gymnasium.Env, task: Any, gold: GoldReply) -> GoldEpisode:
    """Reset ``env`` on ``task`` and step ``gold`` through its real ``step`` (tool calls run by
    the env as in training) until the replies run out or the env ends the episode; a function
    gold is asked for a reply each turn until the env ends it (at most ``env.max_turns`` turns).

    Raises EnvError naming the turn when a reply is not a str, ``step`` raises or returns out of
    contract, a tool call of a gold reply fails (``info["tool_errors"]``), or the env ends the
    episode with gold replies left."""
    name = type(env).__name__
    episode = GoldEpisode(name, task)
    if isinstance(gold, str):
        replies: list[str] | None = [gold]
    elif isinstance(gold, Sequence) and gold:
        replies = list(gold)
    elif callable(gold):
        replies = None
    else:
        raise EnvError(
            f"{name}.gold_reply must return a str, a non-empty list of str (one per turn), a function "
            f"messages -> str, or None; got {describe(gold)} for task {short_repr(task)}"
        )
    messages, _ = check_reset_result(env, call_with_timeout(env.reset, None, seed=0, options={"task": dict(task)}))
    conversation = [dict(m) for m in messages]
    turns = len(replies) if replies is not None else max(1, int(getattr(env, "max_turns", 1)))
    for turn in range(1, turns + 1):
        if episode.ended:
            left = turns - turn + 1
            raise episode.fail(turn - 1, f"ended it ({episode.ended}) with {left} of {turns} gold replies unplayed")
        try:
            reply = replies[turn - 1] if replies is not None else gold([dict(m) for m in conversation])
        except Exception as exc:
            raise episode.fail(turn, f"could not be played: the gold function raised {one_line(exc)}") from exc
        if not isinstance(reply, str):
            raise episode.fail(turn, f"has reply {describe(reply)}; every gold reply must be a str")
        try:
            answer, reward, terminated, truncated, info = check_step_result(
                env, call_with_timeout(env.step, None, reply)
            )
        except Exception as exc:
            raise episode.fail(turn, f"failed: step({short_repr(reply)}) raised {one_line(exc)}") from exc
        episode.replies.append(reply)
        episode.answers.append(answer)
        episode.rewards.append(reward)
        episode.ended = "terminated" if terminated else "truncated" if truncated else ""
        conversation += [{"role": "assistant", "content": reply}, *answer]
        if info.get("tool_errors"):
            errors = [m["content"] for m in answer if str(m.get("content", "")).startswith("Error")]
            raise episode.fail(turn, f"made a tool call that failed: {short_repr(reply)} -> {errors or answer}")
        if replies is None and episode.ended:
            break
    return episode
