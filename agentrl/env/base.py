"""``agentrl.Env``: the base class of agentrl environments and the chat-message space it observes
(the contract is in :mod:`agentrl.env`'s docstring)."""

from __future__ import annotations

import abc
import copy
from collections.abc import Iterator, Sequence
from typing import Any, SupportsFloat

import gymnasium

from agentrl.env.checks import ROLES, GoldReply, Message, check_flag, check_info, check_messages, check_reward, describe
from agentrl.env.tasks import Task
from agentrl.errors import EnvError

ASK_REWARD = (
    "give --reward NAME (agentrl plugins lists them), --reward path/file.py:func or module:func "
    "(agentrl- or TRL-style), or SCHEME:ARGUMENT (rm:MODEL_DIR, judge:MODEL)"
)
"""How to give a run its reward functions, in words (said where a run would have none)."""


def boxed_reply(task: Task) -> str | None:
    """``\\boxed{answer}`` for a task with a non-None ``answer``, else None (the default gold reply)."""
    answer = task.get("answer")
    return None if answer is None else f"\\boxed{{{answer}}}"


class MessagesSpace(gymnasium.spaces.Space):
    """The space of chat-message lists: each a dict with a ``role`` and a string ``content``."""

    def __init__(self, max_messages: int = 64, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_messages = max_messages

    @property
    def is_np_flattenable(self) -> bool:
        """Messages have no fixed-size flat form."""
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        """A random one-message list (for checkers; real observations come from the env)."""
        text = "".join(chr(c) for c in self.np_random.integers(97, 123, size=8))
        return [{"role": "user", "content": text}]

    def contains(self, x: Any) -> bool:
        """True if ``x`` is a list of well-formed messages."""
        return (
            isinstance(x, list)
            and len(x) <= self.max_messages
            and all(isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in x)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace) and other.max_messages == self.max_messages

    def __repr__(self) -> str:
        return f"MessagesSpace(max_messages={self.max_messages})"


class Env(gymnasium.Env, abc.ABC):
    """Base class of agentrl environments (subclass it; see the module docstring).

    Subclasses implement ``train_tasks``, ``eval_tasks``, ``start`` (messages for a task) and
    ``respond`` (react to one assistant message). ``reset``/``step`` do the gymnasium
    bookkeeping around them.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    default_rewards: dict[str, float] = {}
    """Extra reward functions (name -> weight) used when the user names none with ``--reward``."""
    max_turns: int = 1
    """Turns after which the rollout truncates the episode (an env may end it sooner)."""
    success_threshold: float = 1.0
    """The headline accuracy counts an episode solved when its ``info["success"]`` (else
    ``info["correct"]``) is true; an env that sets neither is solved when its return reaches this
    (so a return that scores a lost game in (0, 1) is not a success)."""
    concurrent_safe: bool = True
    """The rollout calls ``reset``/``step`` of different episodes' instances at the same time
    (``env_workers`` threads; ``async def`` methods on one event loop), never two calls on one
    instance. False: this class's calls are made one after another, as with ``env_workers: 1``;
    set it when instances share state that is not thread-safe (module globals, the process-wide
    ``random``/``np.random`` as :class:`agentrl.PrivateGlobalRandom` swaps them, one client)."""
    scores_episodes: bool = True
    """False: this env's own reward is always 0 (it only presents tasks, e.g. prompts without an
    answer), so a run of it with no reward function is refused at start-up: nothing would train."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = MessagesSpace()
        self.action_space = gymnasium.spaces.Text(max_length=8192)
        self.task: Task | None = None
        self.turn = 0
        self.template_renders_tools = False
        """True when the rollout's chat template renders ``tool_schemas()`` itself (set by reset)."""

    # -- task source ---------------------------------------------------------------------------
    @abc.abstractmethod
    def train_tasks(self) -> Sequence[Task]:
        """Tasks to train on (an indexable sequence; may be procedurally generated)."""

    @abc.abstractmethod
    def eval_tasks(self) -> Sequence[Task]:
        """Held-out tasks, disjoint from ``train_tasks``, for ``agentrl eval``."""

    def use_tasks(self, train: Sequence[Task], held_out: Sequence[Task]) -> None:
        """Take ``train`` and ``held_out`` as this env's task source from now on (a run with a
        ``dataset``: its rows replace the env's own tasks). An env whose episodes need task fields
        may override this to check the rows have them, raising ConfigError naming the missing
        field, then call ``super().use_tasks``."""
        self.train_tasks = _Returns(train)  # type: ignore[method-assign]
        self.eval_tasks = _Returns(held_out)  # type: ignore[method-assign]

    # -- episode logic ---------------------------------------------------------------------------
    @abc.abstractmethod
    def start(self, task: Task) -> list[Message]:
        """Messages that open an episode on ``task`` (system and/or user)."""

    def tool_schemas(self) -> list[dict[str, Any]]:
        """JSON schemas of the env's tools, for chat templates that render ``tools=`` ([]: none)."""
        return []

    @abc.abstractmethod
    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """React to the assistant's ``text``: (messages to append, reward, terminated, info)."""

    def gold_reply(self, task: Task) -> GoldReply:
        """What a perfect model replies on ``task``: the gold episode that earns the maximum reward.

        One reply (a str), a list of replies (one per assistant turn: tool calls, then the answer),
        or a function that plays the episode (given the conversation so far it returns the next
        reply; it can read tool results), or None where no gold can be given (open-ended tasks).
        ``agentrl.testing.check_env`` resets on a few tasks, steps the gold episode through
        ``step`` and expects the max reward, naming the turn where it went wrong (None: a warning
        says the task was not checked). The default is ``\\boxed{answer}`` when the task has an
        ``answer``; override it for another format (``<answer>42</answer>``) or a multi-turn env.
        """
        return boxed_reply(task)

    def validated_tasks(self, split: str = "train") -> Sequence[Task]:
        """``train_tasks()`` or ``eval_tasks()``, checked to be an indexable sequence (train: non-empty).

        Raises EnvError naming the method and what it returned otherwise (a generator, a dict...).
        """
        if split not in ("train", "eval"):
            raise EnvError(f"validated_tasks: split must be 'train' or 'eval', got {split!r}")
        method = f"{type(self).__name__}.{split}_tasks"
        tasks = self.train_tasks() if split == "train" else self.eval_tasks()
        if isinstance(tasks, (str, bytes, dict)) or not (hasattr(tasks, "__len__") and hasattr(tasks, "__getitem__")):
            hint = (
                ": an iterator can be read only once and has no length; return a list (or agentrl.LazyTasks "
                "to make tasks on demand)"
                if isinstance(tasks, Iterator)
                else ""
            )
            raise EnvError(
                f"{method} must return an indexable sequence of task dicts (a list or "
                f"agentrl.LazyTasks); got {describe(tasks)}{hint}"
            )
        if split == "train" and len(tasks) == 0:
            raise EnvError(f"{method} returned an empty sequence; it must hold at least one task dict")
        return tasks

    # -- gymnasium API -----------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``options["task"]``, or on a seeded draw from ``train_tasks``.

        ``options["template_renders_tools"]``: the caller renders ``tool_schemas()`` through the
        chat template's ``tools=``, so the env need not describe its tools in the prompt.
        """
        super().reset(seed=seed)
        options = options or {}
        task = options.get("task")
        if task is None:
            tasks = self.validated_tasks("train")
            task = tasks[int(self.np_random.integers(len(tasks)))]
        if not isinstance(task, dict):
            raise EnvError(f"{type(self).__name__}.reset: task must be a dict, got {type(task).__name__}")
        # Deep copies: the task source may hand out cached dicts (nested metadata included), and
        # gymnasium's contract is fresh data per call, so env.task, info["task"] and the source
        # never share a mutable object.
        self.task = copy.deepcopy(task)
        self.turn = 0
        self.template_renders_tools = bool(options.get("template_renders_tools", False))
        messages = self.start(self.task)
        self._check_messages("start", messages, non_empty=True)
        return messages, {"task": copy.deepcopy(self.task)}

    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply the assistant's message ``action``; truncates after ``max_turns`` turns."""
        if self.task is None:
            raise EnvError(f"{type(self).__name__}.step called before reset()")
        if not isinstance(action, str):
            raise EnvError(f"{type(self).__name__}.step: action must be str, got {type(action).__name__}")
        self.turn += 1
        result = self.respond(action)
        where = f"{type(self).__name__}.respond"
        if not (isinstance(result, tuple) and len(result) == 4):
            raise EnvError(f"{where} must return (messages, reward, terminated, info); got {describe(result)}")
        messages, reward, terminated, info = result
        self._check_messages("respond", messages, non_empty=False)
        check_reward(where, reward, "2nd")
        check_flag(where, terminated, "terminated", "3rd")
        check_info(where, info, "4th")
        truncated = not terminated and self.turn >= self.max_turns
        return messages, float(reward), bool(terminated), bool(truncated), info

    def _check_messages(self, method: str, messages: Any, non_empty: bool) -> None:
        """Raise EnvError unless ``messages`` (returned by ``method``) is a valid message list."""
        check_messages(f"{type(self).__name__}.{method}", messages, non_empty)


class _Returns:
    """A method stand-in returning one value (picklable, unlike a lambda): :meth:`Env.use_tasks`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value
