"""The run's env scores an agent's final answer, so agent runs have an env return and held-out accuracy.

An agent program replaces the env's ``reset``/``step`` loop, so its episodes have no env reward:
held-out accuracy (which reads the env's ``success``/``correct``/return) would be 0 for any agent.
With ``plugins.openai_agent.env_scores`` (on by default) each episode whose agent returned its
final answer (a str: :func:`with_final_answer` makes it the final assistant message), its final
messages or None is judged by the run's env as a one-turn episode: ``reset`` on the task,
then one ``step`` with the text of the final assistant message. The step's reward becomes the
episode's env return (weighted by ``env_weight`` as for an env-driven episode) and its info
(``correct``, ``success``, ...) the trajectory's. For single-turn checkers (math, the tool envs'
final-answer check) that is the same score an env-driven episode gets; a multi-turn env's step
is what its first turn would score. An agent that returns a number sets the return itself.

The calls run under the run's :class:`agentrl.CallGuard`: a failing or slow env leaves the episode
scored by the reward functions only (``on_call_error: skip``, warned once) or stops the run
(``fail``).
"""

from __future__ import annotations

from typing import Any

from agentrl import (
    AgentRLError,
    CallGuard,
    EnvCall,
    EnvError,
    EnvLibraryError,
    EnvWorkers,
    Trajectory,
    check_reset_result,
    check_step_result,
    one_line,
    sample_label,
)


def final_answer(trajectory: Trajectory) -> str | None:
    """The text of the episode's last assistant message (None when it has none)."""
    for message in reversed(trajectory.messages):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return None


def with_final_answer(messages: list[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
    """``messages`` (the last call's conversation and reply, as recorded) with ``answer``, the
    text an agent returned, as the final assistant message: it replaces the last assistant
    message (so the conversation keeps one assistant message per call, as the reward functions
    count them), or is appended when there is none."""
    final = {"role": "assistant", "content": answer}
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return [*messages[:index], final, *messages[index + 1 :]]
    return [*messages, final]


def with_final_messages(messages: list[dict[str, Any]], returned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation to score when an agent returned the messages ``returned``: them, when they
    hold the conversation (a ``system``, ``developer`` or ``user`` message); else they are its end
    (an agent framework's final output, e.g. ``[{"role": "assistant", "content": answer}]``): they
    replace the last assistant message of ``messages`` (the last call's conversation and reply, as
    recorded) and what follows it, so the episode keeps its system prompt, question and tool calls."""
    if any(m.get("role") in ("system", "developer", "user") for m in returned):
        return returned
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return [*messages[:index], *returned]
    return [*messages, *returned]


def score_with_env(envs: list[Any], trajectories: list[Trajectory], guard: CallGuard, workers: int) -> int:
    """Give each trajectory in ``trajectories`` (those to score: the agent returned messages or
    None, no error, the model was called) its env's score of the final answer; returns how many
    were scored. ``envs[i]`` judges ``trajectories[i]``."""
    pool = EnvWorkers(guard, workers)
    answers = [final_answer(t) for t in trajectories]
    todo = [i for i, answer in enumerate(answers) if answer is not None and trajectories[i].turns]
    resets = pool.gather([EnvCall(envs[i], "reset", kwargs={"options": {"task": trajectories[i].task}}) for i in todo])
    ready = []
    for i, outcome in zip(todo, resets):
        if _checked(envs[i], trajectories[i], "reset", outcome, guard) is not None:
            ready.append(i)
    steps = pool.gather([EnvCall(envs[i], "step", (answers[i],)) for i in ready])
    scored = 0
    for i, outcome in zip(ready, steps):
        result = _checked(envs[i], trajectories[i], "step", outcome, guard)
        if result is None:
            continue
        _, reward, _, _, info = check_step_result(envs[i], result)
        trajectory = trajectories[i]
        trajectory.turns[-1].reward = float(reward)
        merged = {**trajectory.info, **dict(info), "env_scored": True}
        if isinstance(info.get("metrics"), dict):  # the env's figures beside the episode's own (agent/...)
            merged["metrics"] = {**trajectory.info.get("metrics", {}), **info["metrics"]}
        trajectory.info = merged
        scored += 1
    return scored


def _checked(
    env: Any, trajectory: Trajectory, method: str, outcome: tuple[Any, BaseException | None], guard: CallGuard
) -> Any:
    """The call's result (a reset's checked), or None when env code failed and ``on_call_error``
    is ``skip``; EnvError with ``fail``; a broken contract always raises."""
    result, exc = outcome
    if exc is None:
        if method == "reset":
            check_reset_result(env, result)
        return result
    if isinstance(exc, AgentRLError) and not isinstance(exc, EnvLibraryError):
        raise exc  # a broken contract
    what = (
        f"{type(env).__name__}.{method} (scoring the agent's final answer) failed on "
        f"{sample_label(0, trajectory.task)}: {one_line(exc)}"
    )
    if not guard.skips:
        raise EnvError(
            f"{what} (on_call_error=fail; with 'skip' the episode is scored by the reward functions only)"
        ) from exc
    guard.warn_once(
        f"agent-env:{type(env).__name__}", f"{what}; the reward functions alone score it (on_call_error=skip)"
    )
    return None
