"""``agentrl.Env``: a gymnasium environment whose observations are chat messages.

Observation: the list of chat messages to append to the conversation (system/user at ``reset``,
tool or user messages after a ``step``). Action: the assistant's message text.

    reset(seed=None, options=None) -> (messages, info)
    step(text) -> (messages, reward, terminated, truncated, info)

A task is a plain dict (``question``, ``answer``, any other columns). The rollout gives every
member of a group the same task through ``reset(options={"task": task})``; without it the env
draws a training task from its own seeded RNG. ``train_tasks`` / ``eval_tasks`` expose the
task source and the held-out split.

Env-specific figures: a ``step``'s ``info["metrics"]`` (name -> float) as it stands at the
episode's last step is averaged over the batch's episodes and logged as ``env/NAME`` (training)
and ``eval/env/NAME`` (evaluation); keep it a running summary of the whole episode.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any, SupportsFloat

import gymnasium
import numpy as np

from agentrl.errors import EnvError

Message = dict[str, Any]
Task = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")


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
            and all(
                isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
                for m in x
            )
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

    # -- gymnasium API -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``options["task"]``, or on a seeded draw from ``train_tasks``.

        ``options["template_renders_tools"]``: the caller renders ``tool_schemas()`` through the
        chat template's ``tools=``, so the env need not describe its tools in the prompt.
        """
        super().reset(seed=seed)
        options = options or {}
        task = options.get("task")
        if task is None:
            tasks = self.train_tasks()
            task = tasks[int(self.np_random.integers(len(tasks)))]
        if not isinstance(task, dict):
            raise EnvError(f"{type(self).__name__}.reset: task must be a dict, got {type(task).__name__}")
        self.task = dict(task)
        self.turn = 0
        self.template_renders_tools = bool(options.get("template_renders_tools", False))
        return self.start(self.task), {"task": self.task}

    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply the assistant's message ``action``; truncates after ``max_turns`` turns."""
        if self.task is None:
            raise EnvError(f"{type(self).__name__}.step called before reset()")
        if not isinstance(action, str):
            raise EnvError(f"{type(self).__name__}.step: action must be str, got {type(action).__name__}")
        self.turn += 1
        messages, reward, terminated, info = self.respond(action)
        truncated = not terminated and self.turn >= self.max_turns
        return messages, float(reward), bool(terminated), bool(truncated), info


def load_env_class(spec: str) -> type[Env]:
    """Load an Env subclass from ``path/to/file.py:ClassName`` or ``package.module:ClassName``."""
    if ":" not in spec:
        raise EnvError(f"env spec {spec!r} must look like 'file.py:ClassName' or 'module:ClassName'")
    where, _, class_name = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            from pathlib import Path

            path = Path(where)
            if not path.is_file():
                raise EnvError(f"env file {where!r} does not exist")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except EnvError:
        raise
    except Exception as exc:
        raise EnvError(f"could not import env {spec!r}: {exc!r}") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise EnvError(f"{spec!r}: {class_name!r} is not an agentrl.Env subclass in {where!r}")
    return cls


GYMNASIUM_IDS = {
    "agentrl/Math-v0": "agentrl_math:MathEnv",
    "agentrl/Calculator-v0": "agentrl_tool_envs:CalculatorEnv",
    "agentrl/Python-v0": "agentrl_tool_envs:PythonEnv",
    "agentrl/Guess-v0": "agentrl_guess:GuessEnv",
}


def register_gymnasium_envs() -> None:
    """Register the built-in envs with gymnasium (its ``gymnasium.envs`` entry point calls this)."""
    for env_id, entry_point in GYMNASIUM_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


def seeded_rng(seed: int) -> np.random.Generator:
    """A numpy Generator for task sources (one place, so seeding is uniform)."""
    return np.random.default_rng(seed)


# gymnasium 1.x no longer loads the ``gymnasium.envs`` entry-point group, so the ids are
# registered on import, as ale_py and minigrid do: after ``import agentrl``,
# ``gymnasium.make("agentrl/Math-v0")`` works; ``gymnasium.make("agentrl:agentrl/Math-v0")`` also
# works without the import. Registration only records entry-point strings; nothing is imported.
register_gymnasium_envs()
