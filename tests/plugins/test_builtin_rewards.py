"""Built-in reward functions (``format``, ``accuracy``) and the reward contract checks."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

import agentrl
from agentrl import RewardError, Trajectory
from agentrl.testing import check_reward, make_trajectory
from agentrl_rewards import accuracy_reward, format_reward

TASK = {"question": "What is 7 + 5? Put the final answer in \\boxed{}.", "answer": "12"}


def reply(text: str, task: dict[str, Any] | None = None) -> Trajectory:
    """A one-turn trajectory answering ``task`` (default: 7 + 5) with ``text``."""
    task = TASK if task is None else task
    return make_trajectory(
        [{"role": "user", "content": task["question"]}, {"role": "assistant", "content": text}], task
    )


def sample_trajectories() -> list[Trajectory]:
    """Replies of every kind, including a task with no answer and a two-turn episode."""
    two_turns = make_trajectory(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "11"},
            {"role": "user", "content": "Try again."},
            {"role": "assistant", "content": "\\boxed{12}"},
        ],
        TASK,
    )
    return [
        reply("\\boxed{12}"),
        reply("12"),
        reply("\\boxed{13}"),
        reply("no idea"),
        reply("\\boxed{x}", {"question": "Say x."}),
        two_turns,
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{12}", 1.0),
        ("\\boxed{-3}", 1.0),
        ("So \\boxed{0.5}.", 1.0),
        ("\\boxed{13}", 1.0),  # format only: a wrong number is still well formatted
        ("\\boxed{x}", 0.0),
        ("\\boxed{12} then \\boxed{abc}", 0.0),  # the last box is the answer
        ("\\boxed{}", 0.0),
        ("12", 0.0),
    ],
)
def test_format(text: str, expected: float) -> None:
    assert format_reward([reply(text)]) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{12}", 1.0),
        ("\\boxed{12.0}", 1.0),
        ("\\boxed{13}", 0.0),
        ("12", 0.0),  # strict: the math env's lenient parse would accept this
        ("\\boxed{13}, I mean 12", 0.0),
    ],
)
def test_accuracy(text: str, expected: float) -> None:
    assert accuracy_reward([reply(text)]) == [expected]


def test_accuracy_is_none_without_an_answer_and_reads_the_last_turn() -> None:
    scores = accuracy_reward(sample_trajectories())
    assert scores == [1.0, 0.0, 0.0, 0.0, None, 1.0]
    assert format_reward(sample_trajectories()) == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]


def test_no_assistant_message_scores_zero() -> None:
    silent = make_trajectory([{"role": "user", "content": "q"}], TASK)
    assert format_reward([silent]) == [0.0] and accuracy_reward([silent]) == [0.0]


def test_make_trajectory_is_self_consistent() -> None:
    trajectory = sample_trajectories()[-1]
    trajectory.validate()
    assert trajectory.loss_mask == [0, 1, 0, 1] and len(trajectory.turns) == 2
    assert trajectory.completion_text == "\\boxed{12}"


# -- the contract, through the real entry points -------------------------------------------------
def _reward_names() -> list[str]:
    return agentrl.load_plugins().registry.names("reward")


@pytest.mark.parametrize("name", _reward_names(), ids=lambda name: name)
def test_registered_reward_passes_check_reward(name: str) -> None:
    fn = agentrl.load_plugins().registry.get("reward", name).factory
    judges_answers = name not in NOT_ABOUT_THE_ANSWER
    check_reward(fn, sample_trajectories(), full_marks=1.0 if judges_answers else None)


NOT_ABOUT_THE_ANSWER = {"tool_use"}


def with_tool_calls(per_turn: list[tuple[int, int]]) -> Trajectory:
    """A trajectory with one turn per (tool_calls, tool_errors) pair."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    for _ in per_turn:
        messages += [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}]
    trajectory = make_trajectory(messages[:-1], TASK)
    for turn, (calls, errors) in zip(trajectory.turns, per_turn, strict=True):
        turn.tool_calls, turn.tool_errors = calls, errors
    return trajectory


def test_tool_use_rewards_a_call_that_ran_once_per_episode() -> None:
    fn = agentrl.load_plugins().registry.get("reward", "tool_use").factory
    cases = {
        (): 0.0,
        ((0, 0),): 0.0,
        ((1, 1),): 0.5,
        ((2, 2), (1, 1), (0, 0)): 0.5,
        ((1, 0),): 1.0,
        ((1, 1), (1, 0), (0, 0)): 1.0,
        ((4, 0), (4, 0), (0, 0)): 1.0,
    }
    trajectories = [with_tool_calls(list(turns)) for turns in cases]
    assert [len(t.turns) for t in trajectories] == [len(k) for k in cases]
    assert fn(trajectories=trajectories) == list(cases.values())


def test_builtin_rewards_are_registered() -> None:
    assert {"format", "accuracy"} <= set(_reward_names())


def test_check_reward_names_broken_rules() -> None:
    def short(trajectories: list[Trajectory]) -> list[float | None]:
        return [1.0]

    def not_a_number(trajectories: list[Trajectory]) -> list[float | None]:
        return [math.nan] * len(trajectories)

    def stingy(trajectories: list[Trajectory]) -> list[float | None]:
        return [0.5] * len(trajectories)

    def broken(trajectories: list[Trajectory]) -> list[float | None]:
        raise KeyError("answer")

    data = sample_trajectories()
    with pytest.raises(RewardError, match=re.escape("reward 'short' must return a list of 6 scores, got 1 items")):
        check_reward(short, data)
    with pytest.raises(
        RewardError, match=re.escape("reward 'not_a_number': score 0 is nan; expected a finite float or None")
    ):
        check_reward(not_a_number, data)
    with pytest.raises(
        RewardError, match=re.escape("reward 'stingy' gave the gold reply '\\\\boxed{12}' 0.5, expected full marks 1.0")
    ):
        check_reward(stingy, data)
    check_reward(stingy, data, full_marks=None)
    with pytest.raises(RewardError, match=re.escape("reward 'broken' raised on 6 trajectories: KeyError('answer')")):
        check_reward(broken, data)
