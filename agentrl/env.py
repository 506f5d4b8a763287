"""``agentrl.Env``: a gymnasium environment whose observations are chat messages.

Observation: the list of chat messages to append to the conversation (system/user at ``reset``,
tool or user messages after a ``step``). Action: the assistant's message text.

    reset(seed=None, options=None) -> (messages, info)
    step(text) -> (messages, reward, terminated, truncated, info)

A task is a plain dict (``question``, ``answer``, any other columns). The rollout gives every
member of a group the same task through ``reset(options={"task": task})``; without it the env
draws a training task from its own seeded RNG. ``train_tasks`` / ``eval_tasks`` expose the
task source and the held-out split.

``gold_reply(task)`` is the reply that earns the maximum reward (``\\boxed{answer}`` by default;
None where no single reply is right, e.g. games): ``agentrl.testing.check_env`` steps it.

``reset`` and ``step`` check what ``train_tasks``, ``start`` and ``respond`` return (cheap checks)
and raise :class:`agentrl.EnvError` naming the env, the method, what it returned and the shape
expected, instead of a failure deep inside gymnasium or the chat template.

Env-specific figures: a ``step``'s ``info["metrics"]`` (name -> float) as it stands at the
episode's last step is averaged over the batch's episodes and logged as ``env/NAME`` (training)
and ``eval/env/NAME`` (evaluation); keep it a running summary of the whole episode.

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
  daemon thread (the trainer gives that episode's slot a fresh env instance). Make a long
  computation check its own deadline, or run it in a subprocess as the code sandbox does.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import inspect
import math
import numbers
import random
import reprlib
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, SupportsFloat, TypeVar

import gymnasium
import numpy as np

from agentrl.errors import AgentRLError, EnvError, EnvLibraryError, one_line
from agentrl.faults import plugin_exit
from agentrl.tasks import LazyTasks

R = TypeVar("R")

Message = dict[str, Any]
Task = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")
MESSAGES_SHAPE = "a list of {'role': 'system'|'user'|'assistant'|'tool', 'content': str} dicts"
"""The shape ``start`` and ``respond`` must give their messages in (for error messages)."""

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 4


def describe(value: Any) -> str:
    """A short description of ``value`` for error messages: "a str 'abc'", "a tuple of 3 values"."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} value{'s' if len(value) != 1 else ''}"
    if isinstance(value, (str, bytes, numbers.Number, list, dict)):
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} {_REPR.repr(value)}"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


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
    success_threshold: float = 1.0
    """The headline accuracy counts an episode solved when its ``info["success"]`` (else
    ``info["correct"]``) is true; an env that sets neither is solved when its return reaches this
    (so a return that scores a lost game in (0, 1) is not a success)."""

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

    def gold_reply(self, task: Task) -> str | None:
        """The reply that earns the maximum reward on ``task`` in one step, or None if none can.

        ``agentrl.testing.check_env`` resets on a few tasks, steps this reply and expects the max
        reward. The default is ``\\boxed{answer}`` when the task has an ``answer``; override it for
        another answer format (``<answer>42</answer>``), or return None where no single reply is
        right (games, open-ended tasks) so the check skips the task.
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
            hint = (": an iterator can be read only once and has no length; return a list (or agentrl.LazyTasks "
                    "to make tasks on demand)" if isinstance(tasks, Iterator) else "")
            raise EnvError(f"{method} must return an indexable sequence of task dicts (a list or "
                           f"agentrl.LazyTasks); got {describe(tasks)}{hint}")
        if split == "train" and len(tasks) == 0:
            raise EnvError(f"{method} returned an empty sequence; it must hold at least one task dict")
        return tasks

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
        _check_reward(where, reward, "2nd")
        _check_flag(where, terminated, "terminated", "3rd")
        _check_info(where, info, "4th")
        truncated = not terminated and self.turn >= self.max_turns
        return messages, float(reward), bool(terminated), bool(truncated), info

    def _check_messages(self, method: str, messages: Any, non_empty: bool) -> None:
        """Raise EnvError unless ``messages`` (returned by ``method``) is a valid message list."""
        check_messages(f"{type(self).__name__}.{method}", messages, non_empty)


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
            problem = f"has no 'content' (a str): {_REPR.repr(message)}"
        elif not isinstance(message["content"], str):
            problem = f"has content {describe(message['content'])}; it must be a str"
        else:
            continue
        raise EnvError(f"{where}: message {i} {problem} (expected {MESSAGES_SHAPE})")


MAX_ABS_REWARD = 1e9
"""The largest reward magnitude a run takes (from an env step or a weighted reward function).
Training math runs in float32 (rewards in the batch, the loss, PPO's squared value error); within
±1e9, sums and squares stay far from float32's 3.4e38, and a larger value is almost always a unit
bug or a sentinel (``sys.float_info.max`` for "never"). A bigger one stops the run naming where it
came from, instead of overflowing into a step skipped as unscored."""


def _check_reward(where: str, reward: Any, position: str) -> None:
    if not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise EnvError(f"{where} must return a finite number as its reward ({position} value); got "
                       f"{describe(reward)} (an env that cannot score an episode should raise)")
    if abs(reward) > MAX_ABS_REWARD:
        raise EnvError(f"{where} returned reward {float(reward):g} ({position} value): rewards must be within "
                       f"±{MAX_ABS_REWARD:g} (training runs in float32; larger values overflow it): rescale it")


def _check_flag(where: str, flag: Any, name: str, position: str) -> None:
    if not isinstance(flag, (bool, np.bool_)):
        raise EnvError(f"{where} must return a bool as {name} ({position} value); got {describe(flag)}")


def _check_info(where: str, info: Any, position: str) -> None:
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
    _check_info(where, info, "2nd")
    return messages, info


def check_step_result(env: gymnasium.Env, result: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
    """``result`` of ``env.step`` as ``(messages, reward, terminated, truncated, info)``; EnvError
    naming the env, the method, what it returned and the expected shape otherwise."""
    where = f"{type(env).__name__}.step"
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvError(f"{where} must return (messages, reward, terminated, truncated, info); got {describe(result)}")
    messages, reward, terminated, truncated, info = result
    check_messages(where, messages, non_empty=False)
    _check_reward(where, reward, "2nd")
    _check_flag(where, terminated, "terminated", "3rd")
    _check_flag(where, truncated, "truncated", "4th")
    _check_info(where, info, "5th")
    return messages, float(reward), bool(terminated), bool(truncated), info


def task_label(task: Any) -> str:
    """``task 'id-7': 'What is 2 + 2?'`` (its id and question or prompt, cut short) for messages."""
    if not isinstance(task, dict):
        return f"task {describe(task)}"
    parts = [repr(task["id"])] if "id" in task else []
    text = task.get("question", task.get("prompt"))
    if text is not None:
        parts.append(_REPR.repr(text if isinstance(text, str) else str(text)))
    return f"task {': '.join(parts)}" if parts else f"task {_REPR.repr(task)}"


def sample_label(index: int, task: Any) -> str:
    """``sample 3 (task 'id-7': 'What is 2 + 2?')``: a batch sample for error messages."""
    return f"sample {index} ({task_label(task)})"


ON_CALL_ERROR = ("skip", "fail")
"""Values of ``TrainConfig.on_call_error``."""


class CallTimeout(TimeoutError):
    """A call into user code ran past its time limit and was abandoned (it may still be running)."""


def call_with_timeout(fn: Callable[..., R], timeout_s: float | None, *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``, raising :class:`CallTimeout` if it runs past ``timeout_s`` seconds.

    The call runs in a daemon worker thread the caller waits on. Python cannot kill a thread: a
    call past the limit is abandoned and keeps running in the background until it returns (a
    daemon thread does not keep the process alive). ``timeout_s`` None or <= 0: no limit, the call
    runs in the caller's thread. Exceptions from ``fn`` are re-raised in the caller; a SystemExit or
    KeyboardInterrupt that ``fn`` raised itself as a :class:`agentrl.faults.PluginExit` (the call's
    failure, never the end of the run; a real Ctrl-C still interrupts).
    """
    if timeout_s is None or timeout_s <= 0:
        try:
            return fn(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt) as exc:
            failure = plugin_exit(exc)
            if failure is None:  # a real Ctrl-C
                raise
            raise failure from exc
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller
            outcome["error"] = plugin_exit(exc) or exc

    name = getattr(fn, "__qualname__", type(fn).__name__)
    worker = threading.Thread(target=target, name=f"agentrl-call:{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise CallTimeout(f"no result within call_timeout_s={timeout_s:g} s; the call was abandoned and may still "
                          "be running in a background thread")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@dataclass
class CallGuard:
    """How a run calls user code (env methods, reward functions): a time limit per call, what an
    exception or a timeout does (``on_error``: ``skip`` or ``fail``) and which plugins have
    already been warned about (each once)."""

    timeout_s: float | None = None
    """``call_timeout_s``: seconds one call may take (None or <= 0: no limit)."""
    on_error: str = "fail"
    """``on_call_error``: ``skip`` (the sample is unscored and counted) or ``fail`` (stop the run)."""
    warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.on_error not in ON_CALL_ERROR:
            from agentrl.errors import ConfigError

            raise ConfigError(f"on_call_error={self.on_error!r} is invalid: expected one of {', '.join(ON_CALL_ERROR)}")

    @classmethod
    def from_config(cls, config: Any) -> CallGuard:
        """The guard of a run config (``call_timeout_s``, ``on_call_error``); a config without
        them gets no time limit and ``fail``."""
        return cls(getattr(config, "call_timeout_s", None), getattr(config, "on_call_error", "fail"))

    @property
    def skips(self) -> bool:
        """True when a failed call leaves its sample unscored instead of stopping the run."""
        return self.on_error == "skip"

    def call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` under the time limit (see :func:`call_with_timeout`)."""
        return call_with_timeout(fn, self.timeout_s, *args, **kwargs)

    def warn_once(self, plugin: str, message: str) -> None:
        """A RuntimeWarning ``message`` the first time ``plugin`` fails in this run only."""
        if plugin not in self.warned:
            self.warned.add(plugin)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def build_env(factory: Callable[..., Any], env_args: dict[str, Any], name: str) -> Any:
    """``factory(**env_args)``: the env ``name`` (as ``--env`` gave it) built. ``env_args`` that do not
    fit its signature are a ConfigError; anything its constructor raises (SystemExit included) is an
    EnvError naming the env and the cause in one line; an AgentRLError it raises passes unchanged."""
    from agentrl.errors import ConfigError

    try:
        inspect.signature(factory).bind(**env_args)
    except TypeError as exc:
        raise ConfigError(f"env_args {env_args!r} do not fit env {name!r}: {exc}") from None
    except ValueError:
        pass  # no signature to check: the call itself says
    try:
        return factory(**env_args)
    except AgentRLError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        failure = exc if isinstance(exc, Exception) else plugin_exit(exc)
        if failure is None:  # a real Ctrl-C
            raise
        arguments = ", ".join(f"{key}={value!r}" for key, value in env_args.items())
        call = f"{getattr(factory, '__qualname__', type(factory).__name__)}({arguments})"
        raise EnvError(f"env {name!r} failed to start: {call} raised {one_line(failure)}") from exc


def load_env_class(spec: str) -> type[Env]:
    """Load an Env subclass from ``path/to/file.py:ClassName`` or ``package.module:ClassName``
    (the file is imported once, as a real module, so dataclasses and pickling work in it)."""
    from agentrl.errors import ConfigError
    from agentrl.imports import load_object

    if ":" not in spec:
        raise EnvError(f"env spec {spec!r} must look like 'file.py:ClassName' or 'module:ClassName'")
    try:
        cls = load_object(spec, "env")
    except ConfigError as exc:
        raise EnvError(str(exc)) from exc.__cause__
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        where, _, class_name = spec.rpartition(":")
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


class SeedTasks(LazyTasks):
    """Tasks that are just seeds, for envs whose episodes a seeded library generates (games).

    Task ``i`` is ``{"id": f"{name}-{split}-{i}", "seed": first_seed + i}``: give the training and
    held-out splits ranges of seeds that do not overlap.
    """

    def __init__(self, name: str, split: str, first_seed: int, length: int) -> None:
        super().__init__(length)
        self.name, self.split, self.first_seed = name, split, first_seed

    def make(self, index: int) -> Task:
        """Task ``index``: its id and seed."""
        return {"id": f"{self.name}-{self.split}-{index}", "seed": self.first_seed + index}


@contextlib.contextmanager
def library_call(library: str, env_id: str, call: str) -> Iterator[None]:
    """Run a block of calls into the library an env adapter wraps (and the adapter's conversion of
    what it returns): an exception raised there becomes an :class:`EnvLibraryError` whose one line
    names the library, the env id and the call, e.g. ``textarena env 'Countdown-v0' failed in
    step: ValueError: ...``; during a run ``on_call_error`` then skips the episode or stops the run.
    An agentrl error raised in the block passes through unchanged."""
    try:
        yield
    except AgentRLError:
        raise
    except Exception as exc:
        raise EnvLibraryError(f"{library} env {env_id!r} failed in {call}: {one_line(exc)}") from exc


class PrivateGlobalRandom:
    """A private state for Python's and numpy's process-wide RNGs, for libraries that use them.

    Game libraries (TextArena, GEM) seed and draw from ``random`` / ``np.random`` directly, so
    several env instances stepped in turn would consume each other's random streams. Run every
    call into such a library inside ``with rng.active():`` and each instance draws from its own
    stream: the global states are swapped in on entry and swapped back out on exit. Not
    thread-safe (the global RNGs are shared by threads).
    """

    def __init__(self, seed: int = 0) -> None:
        self._python: Any = None
        self._numpy: Any = None
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """Restart both private streams from ``seed``."""
        self._python = random.Random(seed).getstate()
        self._numpy = np.random.RandomState(seed % 2**32).get_state()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make the private states the global ones for the duration of the block."""
        saved_python, saved_numpy = random.getstate(), np.random.get_state()
        random.setstate(self._python)
        np.random.set_state(self._numpy)
        try:
            yield
        finally:
            self._python, self._numpy = random.getstate(), np.random.get_state()
            random.setstate(saved_python)
            np.random.set_state(saved_numpy)


# gymnasium 1.x no longer loads the ``gymnasium.envs`` entry-point group, so the ids are
# registered on import, as ale_py and minigrid do: after ``import agentrl``,
# ``gymnasium.make("agentrl/Math-v0")`` works; ``gymnasium.make("agentrl:agentrl/Math-v0")`` also
# works without the import. Registration only records entry-point strings; nothing is imported.
register_gymnasium_envs()
