"""``agentrl.Env``: a gymnasium environment whose observations are chat messages.

Observation: the list of chat messages to append to the conversation (system/user at ``reset``,
tool or user messages after a ``step``). Action: the assistant's message text.

    reset(seed=None, options=None) -> (messages, info)
    step(text) -> (messages, reward, terminated, truncated, info)

A task is a plain dict (``question``, ``answer``, any other columns). The rollout gives every
member of a group the same task through ``reset(options={"task": task})``; without it the env
draws a training task from its own seeded RNG. ``train_tasks`` / ``eval_tasks`` expose the
task source and the held-out split.

``gold_reply(task)`` is the gold episode that earns the maximum reward (``\\boxed{answer}`` by
default; a list of replies, one per turn, or a function that plays the episode for multi-turn and
tool envs; None where none can be given): ``agentrl.testing.check_env`` steps it.

``reset`` and ``step`` check what ``train_tasks``, ``start`` and ``respond`` return (cheap checks)
and raise :class:`agentrl.EnvError` naming the env, the method, what it returned and the shape
expected, instead of a failure deep inside gymnasium or the chat template.

Env-specific figures: a ``step``'s ``info["metrics"]`` (name -> float) as it stands at the
episode's last step is averaged over the batch's episodes and logged as ``env/NAME`` (training)
and ``eval/env/NAME`` (evaluation); keep it a running summary of the whole episode.

Concurrency: each turn the rollout calls ``reset`` (at the start) or ``step`` of every live
episode at once, through :class:`EnvWorkers`: ``env_workers`` threads for sync methods, one
event loop for ``async def reset``/``async def step`` (an env may define them as coroutines; they
are awaited, no thread each). Each episode has its own instance and two calls on one instance
never overlap; the answers are taken in episode order, so the tokens do not depend on which env
answers first. An env whose instances share state that is not thread-safe sets the class
attribute ``concurrent_safe = False`` and is called one episode at a time.

Failures during a run (the rollout calls ``reset``/``step`` through a :class:`CallGuard`):

* A broken contract (wrong shapes, a reward that is None, NaN, infinite or beyond
  ±:data:`MAX_ABS_REWARD`, any ``AgentRLError``
  the env raises itself) is a programming error: the run stops with an EnvError naming the env
  class, the method, what it returned and what was expected, whatever ``on_call_error`` says. An
  env that cannot score an episode should raise, not return NaN.
* Any other exception (a SystemExit or KeyboardInterrupt the env raises included: see
  :mod:`agentrl.faults`), an :class:`agentrl.EnvLibraryError` (what an adapter raises, through
  :func:`library_call`, when the library it wraps fails), or a call running past ``call_timeout_s``,
  follows ``on_call_error``:
  ``skip`` ends that episode (``info["error"]`` says where and what), leaves it unscored (no
  gradient), counts it in ``errors/env`` and warns once per env class; ``fail`` stops the run
  with an EnvError naming the env, the method, the sample and the exception.
* A Python call cannot be killed: a call past its time limit is abandoned, still running in a
  daemon thread (the trainer gives that episode's slot a fresh env instance); an ``async def``
  call past it is cancelled. Make a long
  computation check its own deadline, or run it in a subprocess as the code sandbox does.

The package, one job per module: :mod:`~agentrl.env.base` (``Env``, ``MessagesSpace``),
:mod:`~agentrl.env.checks` (what ``reset``/``step`` return), :mod:`~agentrl.env.labels` (task and
sample labels for messages), :mod:`~agentrl.env.calls` (``CallGuard``: time limits and
``on_call_error``), :mod:`~agentrl.env.workers` (one turn's env calls at once),
:mod:`~agentrl.env.loading` (env classes from specs, gymnasium ids) and
:mod:`~agentrl.env.sources` (task-source and library-adapter helpers). Import the names from
``agentrl`` (or from here); the submodules are an implementation detail.
"""

from __future__ import annotations

from agentrl.env.base import Env, MessagesSpace, boxed_reply
from agentrl.env.calls import ON_CALL_ERROR, CallGuard, CallTimeout, await_with_timeout, call_with_timeout
from agentrl.env.checks import (
    MAX_ABS_REWARD,
    MESSAGES_SHAPE,
    ROLES,
    Message,
    check_messages,
    check_reset_result,
    check_step_result,
    describe,
)
from agentrl.env.labels import sample_label, task_label
from agentrl.env.loading import GYMNASIUM_IDS, build_env, load_env_class, register_gymnasium_envs
from agentrl.env.sources import PrivateGlobalRandom, SeedTasks, library_call, seeded_rng
from agentrl.env.tasks import Task
from agentrl.env.workers import EnvCall, EnvWorkers

__all__ = [
    "GYMNASIUM_IDS",
    "MAX_ABS_REWARD",
    "MESSAGES_SHAPE",
    "ON_CALL_ERROR",
    "ROLES",
    "CallGuard",
    "CallTimeout",
    "Env",
    "EnvCall",
    "EnvWorkers",
    "Message",
    "MessagesSpace",
    "PrivateGlobalRandom",
    "SeedTasks",
    "Task",
    "boxed_reply",
    "await_with_timeout",
    "build_env",
    "call_with_timeout",
    "check_messages",
    "check_reset_result",
    "check_step_result",
    "describe",
    "library_call",
    "load_env_class",
    "register_gymnasium_envs",
    "sample_label",
    "seeded_rng",
    "task_label",
]

# gymnasium 1.x no longer loads the ``gymnasium.envs`` entry-point group, so the ids are
# registered on import, as ale_py and minigrid do: after ``import agentrl``,
# ``gymnasium.make("agentrl/Math-v0")`` works; ``gymnasium.make("agentrl:agentrl/Math-v0")`` also
# works without the import. Registration only records entry-point strings; nothing is imported.
register_gymnasium_envs()
