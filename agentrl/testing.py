"""Contract checks for environments and reward functions, for agentrl's tests and yours.

    from agentrl.testing import check_env, check_reward
    check_env(MyEnv)                       # a class, a zero-argument factory, or an instance
    check_reward(my_reward, trajectories)  # make_trajectory() builds them without a model

Each rule is a small public ``check_*`` function (as in gymnasium's env checker); every failure
raises :class:`agentrl.EnvError` or :class:`agentrl.RewardError` saying what broke, never a bare
``assert`` (which would vanish under ``python -O``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from agentrl.env import (
    Env,
    MessagesSpace,
    Task,
    boxed_reply,
    call_with_timeout,
    check_reset_result,
    describe,
    task_label,
)
from agentrl.env.checks import play_gold_episode
from agentrl.env.loading import unwrapped_env
from agentrl.env.tasks import first_tasks, task_key
from agentrl.errors import AgentRLError, EnvError, RewardError, one_line
from agentrl.rewards.process import StepRewards, merge_steps
from agentrl.rewards.scoring import Scored
from agentrl.trajectory import Trajectory, Turn

RewardFn = Callable[..., list[float | None]]


def gold_text(task: Task, env: Env | None = None) -> str | None:
    """The final reply a perfect model gives to ``task``: ``env.gold_reply(task)`` (its last reply
    when it is a list; None for a function) when an env is given, else ``\\boxed{answer}`` (None
    when the task has no answer)."""
    gold = env.gold_reply(task) if env is not None else boxed_reply(task)
    if isinstance(gold, Sequence) and not isinstance(gold, str):
        return gold[-1] if gold else None
    return gold if isinstance(gold, str) else None


def make_trajectory(messages: list[dict[str, Any]], task: Task, **fields: Any) -> Trajectory:
    """A self-consistent Trajectory for ``messages`` with dummy tokens (no model needed).

    Every non-assistant message becomes one token with loss mask 0 and every assistant message
    one sampled token (a Turn). ``fields`` set the remaining Trajectory fields (group, info...).
    """
    token_ids, loss_mask, turns = [0], [0], []
    for message in messages:
        if message.get("role") == "assistant":
            turns.append(Turn(start=len(token_ids), end=len(token_ids) + 1))
            token_ids.append(1)
            loss_mask.append(1)
        elif loss_mask[-1] == 1:  # env tokens between two turns
            token_ids.append(0)
            loss_mask.append(0)
    trajectory = Trajectory(
        token_ids=token_ids,
        loss_mask=loss_mask,
        sampler_logprobs=[0.0] * len(token_ids),
        turns=turns,
        messages=[dict(m) for m in messages],
        task=dict(task),
        **fields,
    )
    trajectory.validate()
    return trajectory


def with_completion(trajectory: Trajectory, text: str) -> Trajectory:
    """A copy of ``trajectory`` whose final assistant message is ``text`` (appended if none)."""
    messages = [dict(m) for m in trajectory.messages]
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None:
        messages.append({"role": "assistant", "content": text})
    else:
        messages[last]["content"] = text
    return make_trajectory(messages, trajectory.task, group=trajectory.group)


# -- environments --------------------------------------------------------------------------------
def check_gymnasium_api(env: Env) -> None:
    """gymnasium's own ``check_env`` (spaces, seeding, determinism, fresh data per call)."""
    try:
        gymnasium_check_env(env, skip_render_check=env.spec is None)
    except (AssertionError, AttributeError, TypeError) as exc:
        raise EnvError(f"{type(env).__name__} fails gymnasium's check_env: {exc}") from exc


def check_reset_messages(env: Env) -> None:
    """``reset()`` returns ``(messages, info)``: messages a valid non-empty MessagesSpace list."""
    result = env.reset(seed=0)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvError(f"{type(env).__name__}.reset must return (messages, info), got {result!r}")
    messages, info = result
    if not MessagesSpace().contains(messages) or not messages:
        raise EnvError(
            f"{type(env).__name__}.reset returned messages outside MessagesSpace (a "
            f"non-empty list of {{'role', 'content': str}} dicts): {messages!r}"
        )
    if not isinstance(info, dict):
        raise EnvError(f"{type(env).__name__}.reset info must be a dict, got {type(info).__name__}")


def check_reset_uses_task(env: Env) -> None:
    """``reset(options={"task": t})`` runs the episode on ``t`` (a train and an eval task)."""
    tasks = first_tasks(env.train_tasks(), 1) + first_tasks(env.eval_tasks(), 1)
    for task in tasks:
        _, info = env.reset(options={"task": dict(task)})
        if env.task != task or info.get("task") != task:
            raise EnvError(
                f"{type(env).__name__}.reset(options={{'task': t}}) did not use t: "
                f"t={task!r}, env.task={env.task!r}, info['task']={info.get('task')!r}"
            )


def check_tasks_disjoint(env: Env, sample: int = 256) -> None:
    """``train_tasks`` and ``eval_tasks`` are indexable, and share no question (on a sample)."""
    train, held_out = env.train_tasks(), env.eval_tasks()
    for name, tasks in (("train_tasks", train), ("eval_tasks", held_out)):
        if not isinstance(tasks, Sequence):
            raise EnvError(f"{type(env).__name__}.{name}() must return a Sequence, got {type(tasks).__name__}")
    if len(train) == 0:
        raise EnvError(f"{type(env).__name__}.train_tasks() is empty")
    step = max(1, len(train) // sample)
    train_keys = {task_key(train[i]) for i in range(0, len(train), step)}
    eval_keys = {task_key(held_out[i]) for i in range(min(len(held_out), sample))}
    shared = sorted(train_keys & eval_keys)
    if shared:
        raise EnvError(
            f"{type(env).__name__}: {len(shared)} eval task(s) also appear in "
            f"train_tasks, e.g. {shared[0]!r}; hold them out of training"
        )


class GoldUncheckedWarning(UserWarning):
    """``check_env`` could not play a gold episode on some tasks (``gold_reply`` gave None), so it
    did not check that the env pays a right episode the max reward there."""


def check_gold_answer(env: Env, max_reward: float = 1.0, stacklevel: int = 2) -> int:
    """The gold episode of ``env.gold_reply(task)`` earns ``max_reward`` (first train and eval tasks).

    The gold is one reply, a list of replies (one per assistant turn) or a function that plays
    the episode (:data:`agentrl.env.checks.GoldReply`); it is stepped through the env's real
    ``reset``/``step``, tool calls run by the env. Raises EnvError naming the turn where the
    episode went wrong. Tasks whose gold is None are not played: a :class:`GoldUncheckedWarning`
    says which (``stacklevel`` as in :func:`warnings.warn`). Returns the number of gold episodes played.
    """
    name, played, unchecked = type(env).__name__, 0, []
    tasks = first_tasks(env.train_tasks(), 2) + first_tasks(env.eval_tasks(), 2)
    for task in tasks:
        gold = env.gold_reply(task)
        if gold is None:
            unchecked.append(task)
            continue
        play_gold_episode(env, task, gold).check_return(max_reward)
        played += 1
    if unchecked:
        warnings.warn(
            f"check_env: {name}.gold_reply is None for {len(unchecked)} of the {len(tasks)} tasks tried "
            f"(e.g. {task_label(unchecked[0])}), so no gold episode was played on them: nothing "
            f"checked that a right episode earns the max reward {max_reward!r} there. Return a reply, a "
            "list of replies (one per turn) or a function messages -> reply that plays the episode",
            GoldUncheckedWarning,
            stacklevel=stacklevel,  # the warning points at the caller's line
        )
    return played


def check_step_types(env: Env) -> None:
    """``step`` returns gymnasium's 5-tuple: (messages, float, bool, bool, dict)."""
    env.reset(seed=0)
    result = env.step("I am not sure.")
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvError(f"{type(env).__name__}.step must return a 5-tuple, got {result!r}")
    messages, reward, terminated, truncated, info = result
    problems = []
    if not MessagesSpace().contains(messages):
        problems.append(f"messages {messages!r} outside MessagesSpace")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        problems.append(f"reward {reward!r} is not a finite float")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            problems.append(f"{name} {flag!r} is not a bool")
    if not isinstance(info, dict):
        problems.append(f"info is {type(info).__name__}, not dict")
    if problems:
        raise EnvError(f"{type(env).__name__}.step: " + "; ".join(problems))


def check_max_turns(env: Env) -> None:
    """``env.max_turns`` is an integer >= 1."""
    turns = env.max_turns
    if isinstance(turns, bool) or not isinstance(turns, numbers.Integral) or turns < 1:
        raise EnvError(
            f"{type(env).__name__}.max_turns is {turns!r}; it must be an integer >= 1 (the turns "
            "after which the rollout truncates an episode)"
        )


def check_task_source(env: Env, split: str = "train", required: bool = True) -> Sequence[Task]:
    """``train_tasks()`` / ``eval_tasks()`` is an indexable sequence of task dicts (a list, tuple or
    ``agentrl.LazyTasks``; not a generator), non-empty when ``required``; returns it."""
    method = f"{type(env).__name__}.{split}_tasks"
    try:
        tasks = env.validated_tasks(split)
    except AgentRLError:
        raise
    except Exception as exc:
        raise EnvError(f"{method} raised {one_line(exc)}") from exc
    if required and len(tasks) == 0:
        needed = "to train on" if split == "train" else "to evaluate on (or set eval_tasks: 0)"
        raise EnvError(f"{method} returned an empty sequence; it must hold at least one task dict {needed}")
    if len(tasks) and not isinstance(tasks[0], dict):
        raise EnvError(f"{method}()[0] is {describe(tasks[0])}; every task must be a dict")
    return tasks


def check_first_reset(env: Env, task: Task, timeout_s: float | None = None) -> None:
    """``reset(options={"task": task})`` returns ``(messages, info)`` of the right shapes within
    ``timeout_s`` seconds (None: no limit)."""
    try:
        result = call_with_timeout(env.reset, timeout_s, seed=0, options={"task": task})
    except AgentRLError:
        raise
    except Exception as exc:
        raise EnvError(
            f"{type(env).__name__}.reset raised on the first training task ({task_label(task)}): {one_line(exc)}"
        ) from exc
    check_reset_result(env, result)


def check_env_startup(env: Env, need_eval: bool = True, timeout_s: float | None = None) -> None:
    """The cheap checks a run makes once before any model loads: ``max_turns`` >= 1, the task
    sources (train non-empty; eval non-empty when ``need_eval``) and one ``reset`` on the first
    training task. Raises EnvError naming the env class, the method and what was wrong."""
    if not isinstance(env, Env):
        raise EnvError(f"{type(env).__name__} is not an agentrl.Env subclass")
    check_max_turns(env)
    tasks = check_task_source(env, "train")
    check_task_source(env, "eval", required=need_eval)
    check_first_reset(env, tasks[0], timeout_s)


def check_env(env_factory_or_env: Env | gymnasium.Env | Callable[[], gymnasium.Env], max_reward: float = 1.0) -> None:
    """Run every environment check; raise EnvError naming the first broken rule.

    Accepts an env instance (wrapped by ``gymnasium.make`` or not), an Env class, or a
    zero-argument factory. ``max_reward`` is what the gold episode of ``gold_reply(task)`` (one
    reply, one per turn, or a function that plays it) must earn; a task without a gold is named in
    a :class:`GoldUncheckedWarning`, never skipped silently.
    """
    inner = unwrapped_env(env_factory_or_env, "check_env")
    check_env_startup(inner, need_eval=False)
    check_gymnasium_api(inner)
    check_reset_messages(inner)
    check_reset_uses_task(inner)
    check_tasks_disjoint(inner)
    check_step_types(inner)
    check_gold_answer(inner, max_reward=max_reward, stacklevel=3)


# -- rewards ---------------------------------------------------------------------------------------
def check_reward_output(fn: RewardFn, trajectories: list[Trajectory]) -> list[float | None]:
    """Call ``fn(trajectories=...)``; it must return one finite float, :class:`agentrl.StepRewards`
    (at tokens the model sampled) or None per trajectory, each maybe explained (:class:`agentrl.Scored`,
    returned unwrapped)."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        scores = fn(trajectories=trajectories)
    except Exception as exc:
        raise RewardError(f"reward {name!r} raised on {len(trajectories)} trajectories: {exc!r}") from exc
    if not isinstance(scores, list) or len(scores) != len(trajectories):
        got = f"{len(scores)} items" if isinstance(scores, Sequence) else type(scores).__name__
        raise RewardError(f"reward {name!r} must return a list of {len(trajectories)} scores, got {got}")
    scores = [score.value if isinstance(score, Scored) else score for score in scores]
    for i, score in enumerate(scores):
        if score is None:
            continue
        if isinstance(score, StepRewards):
            merge_steps(trajectories[i], [(name, score, 1.0)])  # a RewardError for a position off the loss mask
            continue
        if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(score):
            raise RewardError(f"reward {name!r}: score {i} is {score!r}; expected a finite float or None")
    return scores


def check_reward_gold(fn: RewardFn, trajectories: list[Trajectory], full_marks: float = 1.0) -> None:
    """Each trajectory, its reply replaced by ``\\boxed{answer}``, scores ``full_marks``."""
    name = getattr(fn, "__name__", repr(fn))
    gold = [with_completion(t, text) for t in trajectories if (text := gold_text(t.task)) is not None]
    for trajectory, score in zip(gold, check_reward_output(fn, gold)):
        score = score.total if isinstance(score, StepRewards) else score
        if score is None or not math.isclose(float(score), full_marks, abs_tol=1e-6):
            raise RewardError(
                f"reward {name!r} gave the gold reply {trajectory.completion_text!r} "
                f"{score!r}, expected full marks {full_marks!r}"
            )


def check_reward(fn: RewardFn, trajectories: list[Trajectory], full_marks: float | None = 1.0) -> None:
    """Run every reward check on ``trajectories``; ``full_marks=None`` skips the gold-answer check."""
    if not trajectories:
        raise RewardError("check_reward needs at least one trajectory")
    check_reward_output(fn, trajectories)
    if full_marks is not None:
        check_reward_gold(fn, trajectories, full_marks)


def parity_reward(trajectories: list[Trajectory]) -> list[float]:
    """1 when the first sampled token id is odd: a reward a random tiny model earns about half the
    time, so its groups have signal (for smoke tests of algorithms and plugins)."""
    return [float(t.token_ids[t.prompt_length] % 2) if t.num_sampled_tokens else 0.0 for t in trajectories]


def build_tiny_model(vocab_size: int, seed: int = 0) -> Any:
    """A random 2-layer Llama with ``vocab_size`` tokens and tied embeddings (like SmolLM2), for
    fast smoke tests of plugins: pair it with the real tokenizer, or save both to a folder usable
    as ``--model``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


class GradientRecorder:
    """Stands in for a trainer's optimizer in tests: keeps each step's gradients (clones) in
    ``steps`` instead of applying them, so gradients of two set-ups can be compared."""

    def __init__(self, params: Any) -> None:
        self.params, self.steps = list(params), []

    def step(self) -> None:
        """Record the current gradients."""
        self.steps.append([p.grad.detach().clone() for p in self.params])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients."""
        for p in self.params:
            p.grad = None


def version_change_at(engine: Any, newer: Any, call: int) -> Callable[[], int]:
    """A ``before_decode_step`` for testing an engine that swaps weights between decode steps: on
    its ``call``-th call (1: before the prefill) it loads ``newer`` with ``engine.sync_weights``;
    it answers version 0 before that call and 1 from it on."""
    calls: list[None] = []

    def refresh() -> int:
        calls.append(None)
        if len(calls) == call:
            engine.sync_weights(newer)
        return int(len(calls) >= call)

    return refresh


LOCKSTEP_WAIT_S = 300.0
"""``plugins.multi_turn.batch_wait_s`` for runs a test compares bit for bit. The rollout samples
each turn's requests together once every running episode has one pending, or ``batch_wait_s``
after the first: on a loaded machine a pause past the default 0.5 s splits a batch, and other
batch shapes change the sampler's logprobs at float rounding (in an on-policy run only the
sampler metrics move; where the loss uses the sampler's logprobs, the weights too). With fast
envs the wait ends as soon as every episode has asked, so it costs nothing."""

LOCKSTEP_ARGS: tuple[str, str] = ("--set", f"plugins.multi_turn.batch_wait_s={LOCKSTEP_WAIT_S:g}")
"""The ``agentrl train`` arguments that set :data:`LOCKSTEP_WAIT_S`."""


def lockstep_plugins() -> dict[str, dict[str, float]]:
    """``TrainConfig.plugins`` with :data:`LOCKSTEP_WAIT_S`: a new dict each call (add a test's own
    sections to it)."""
    return {"multi_turn": {"batch_wait_s": LOCKSTEP_WAIT_S}}
