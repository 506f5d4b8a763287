"""Built-in reward functions: ``format``, ``accuracy`` and ``tool_use``; the reward schemes ``rm:``
(a learned reward model, :mod:`agentrl_rewards.reward_model`), ``prm:`` (a process reward model
scoring each step, :mod:`agentrl_rewards.process_reward_model`) and ``judge:`` (an LLM judge,
:mod:`agentrl_rewards.judge`).

A reward function is called as ``fn(trajectories=list[Trajectory])`` and returns one
``float | None`` per trajectory (``None``: not scored). ``format`` and ``accuracy`` read only the
final assistant message (``Trajectory.completion_text``) and use the core answer parsing
(:mod:`agentrl.answers`) like the ``math`` env, so "the answer" means the same thing to the env
and to its rewards. ``tool_use`` reads the per-turn tool-call counts the env reported.
"""

from __future__ import annotations

from collections.abc import Callable

from agentrl import Trajectory, hookimpl
from agentrl.answers import answers_match, extract_boxed, is_number


def format_reward(trajectories: list[Trajectory]) -> list[float | None]:
    """1.0 if the final reply's last ``\\boxed{...}`` holds a plain number, else 0.0.

    A plain number is an integer or decimal with an optional minus ("12", "-3", "0.5"). The
    answer need not be right: this rewards the habit of boxing the final answer, which the
    default model lacks. Never None.
    """
    scores: list[float | None] = []
    for trajectory in trajectories:
        boxed = extract_boxed(trajectory.completion_text)
        scores.append(1.0 if boxed is not None and is_number(boxed) else 0.0)
    return scores


def accuracy_reward(trajectories: list[Trajectory]) -> list[float | None]:
    """Strict correctness: 1.0 if the last ``\\boxed{}`` answer verifies against ``task["answer"]``.

    Equivalence is mathematical (math-verify; "12.0" matches "12", "1/2" matches "0.5"). A
    reply with no ``\\boxed{}`` scores 0.0, unlike the math env's lenient reward. None when the
    task has no "answer" (nothing to check against).
    """
    scores: list[float | None] = []
    for trajectory in trajectories:
        answer = trajectory.task.get("answer")
        if answer is None:
            scores.append(None)
            continue
        boxed = extract_boxed(trajectory.completion_text)
        scores.append(1.0 if answers_match(boxed, str(answer)) else 0.0)
    return scores


def tool_use_reward(trajectories: list[Trajectory]) -> list[float | None]:
    """Shaping for tool use: 1.0 if a tool call in the episode ran, 0.5 if the model tried (its
    calls were all malformed, unknown or failed), 0.0 if it never wrote one.

    Once per episode, however many calls: spamming calls earns nothing more. Meant as a small
    weight beside the task reward (the tool envs default to 0.2), so that a model which starts
    out rarely calling tools gets a gradient towards calling them; a right answer is still worth
    far more. Never None.
    """
    scores: list[float | None] = []
    for trajectory in trajectories:
        ran, tried = trajectory.num_tool_calls_ok, trajectory.num_tool_calls
        scores.append(1.0 if ran > 0 else 0.5 if tried > 0 else 0.0)
    return scores


@hookimpl
def agentrl_register_rewards(register: Callable[..., None]) -> None:
    """Register ``format``, ``accuracy`` and ``tool_use``."""
    register("format", format_reward)
    register("accuracy", accuracy_reward)
    register("tool_use", tool_use_reward)


@hookimpl
def agentrl_register_reward_schemes(register: Callable[..., None]) -> None:
    """Register ``rm`` (``--reward rm:MODEL_DIR``: a learned reward model), ``prm``
    (``--reward prm:MODEL_DIR``: a process reward model) and ``judge``
    (``--reward judge:policy|openai|MODEL_DIR|ALIAS``: an LLM judge); their folder arguments are
    paths, checked for the model role they play; a bare reward-model folder (``--reward ./my_rm``,
    as TRL takes one) is used as ``rm:``."""
    from agentrl_rewards.judge import is_model_path, judge_scheme
    from agentrl_rewards.process_reward_model import process_reward_model_scheme
    from agentrl_rewards.reward_model import reward_model_scheme

    register("rm", reward_model_scheme, path_argument=True, argument="MODEL_DIR", takes_folder="rm", bare_folder=True)
    register("prm", process_reward_model_scheme, path_argument=True, argument="MODEL_DIR", takes_folder="prm")
    register(
        "judge",
        judge_scheme,
        path_argument=is_model_path,
        argument="policy|openai|MODEL_DIR|MODEL_ALIAS",
        takes_folder="judge",
    )


@hookimpl
def agentrl_register_settings(register: Callable[..., None]) -> None:
    """Register the ``plugins.reward_model``, ``plugins.process_reward_model`` and ``plugins.judge`` sections."""
    from agentrl_rewards import judge, process_reward_model, reward_model

    register(reward_model.SECTION, reward_model.RewardModelConfig)
    register(process_reward_model.SECTION, process_reward_model.ProcessRewardModelConfig)
    register(judge.SECTION, judge.JudgeConfig)
