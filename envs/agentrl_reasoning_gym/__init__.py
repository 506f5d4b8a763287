"""``reasoning_gym``: the procedural tasks of the reasoning-gym library as a single-turn env.

    agentrl train --env reasoning_gym --set env_args.task=leg_counting
    agentrl train --env reasoning_gym --set 'env_args.tasks={leg_counting: 1, basic_arithmetic: 2}'

One task (``task=NAME``, with ``config={...}`` for its dataset config) or a weighted mix
(``tasks={NAME: weight}`` or ``{NAME: {weight: w, config: {...}}}``, built with reasoning-gym's own
``composite`` dataset). The model sees the question, with reasoning-gym's system prompt asking for
the final answer in ``<answer>...</answer>`` tags; the answer is read the way reasoning-gym reads it
(``reasoning_gym.utils.extract_answer``: the last tagged span) and scored by the dataset's own
``score_answer(answer, entry)``, a float in [0, 1]. ``info["success"]`` is a full score.

Small models rarely write the tags (SmolLM2-135M: never, greedy or sampled), which leaves GRPO
nothing to learn from; ``answer_fallback=lenient`` scores a reply without tags by its lenient
answer instead (``agentrl.answers.extract_answer``: the last ``\\boxed{}``, else the last number),
and ``env/answer_tagged`` keeps counting the tag habit.

Splits: item ``i`` of a reasoning-gym dataset is drawn from ``Random(seed + i)``. Training item
``i`` uses seed ``seed + i`` (``seed`` below 10**9); the held-out items use seeds from
:data:`EVAL_SEED` on, so the two never share a generator seed, and a training item whose question
happens to equal a held-out one is replaced by another training item, so they never share a
question either. An item reasoning-gym fails to make (``codeio`` fails on a few: its ``json.dumps``
of a sympy ``Integer``) is replaced the same way; only when every redraw fails does
an :class:`agentrl.EnvLibraryError` name the task and the item.

reasoning-gym is imported when the env is built, so this plugin loads without it (install it with
``pip install 'agentrl[reasoning-gym]'``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field

from agentrl import (
    Allowed,
    ConfigError,
    Env,
    EnvError,
    EnvLibraryError,
    LazyTasks,
    Message,
    OneOf,
    Task,
    check_declared,
    hookimpl,
    import_extra,
    library_call,
)
from agentrl.answers import extract_answer as lenient_answer

TRAIN_SIZE = 100_000
"""Length of the training split (items are generated on demand)."""
EVAL_SEED = 10**12
"""First generator seed of the held-out split, far above every training seed."""
MAX_SEED = 10**9
"""Training seeds must be in [0, MAX_SEED)."""
RETRIES = 64
"""Redraws of a training item whose question is held out before giving up."""
STRIDE = 7_919
"""A redraw of training item ``i`` takes item ``(i + k * STRIDE) % TRAIN_SIZE`` (prime: no short cycle)."""
INSTALL_HINT = "--env reasoning_gym needs the reasoning-gym package: pip install 'agentrl[reasoning-gym]'"


def import_reasoning_gym() -> Any:
    """The ``reasoning_gym`` module, or EnvError naming the extra that installs it."""
    return import_extra("reasoning_gym", INSTALL_HINT)


def task_names() -> list[str]:
    """Names of reasoning-gym's registered tasks (``composite`` excluded)."""
    rg = import_reasoning_gym()
    return sorted(name for name in rg.factory.DATASETS if name != "composite")


def check_task_name(name: Any) -> str:
    """``name`` if reasoning-gym has such a task, else ConfigError with close matches and examples."""
    names = task_names()
    if isinstance(name, str) and name in names:
        return name
    close = difflib.get_close_matches(str(name), names, n=3)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    raise ConfigError(
        f"reasoning_gym: unknown task {name!r}; {hint}{len(names)} tasks, e.g. "
        f"{', '.join(names[:6])} (all: python -c 'import reasoning_gym; "
        "print(sorted(reasoning_gym.factory.DATASETS))')"
    )


def _spec_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, default=repr)


def check_config(name: str, config: dict[str, Any]) -> None:
    """ConfigError naming ``name``'s settings unless reasoning-gym accepts ``config`` for task ``name``."""
    rg = import_reasoning_gym()
    try:
        rg.create_dataset(name, seed=0, size=1, **config)
    except (TypeError, ValueError, AssertionError) as exc:
        config_cls = rg.factory.DATASETS[name][1]
        settings = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
        raise ConfigError(
            f"reasoning_gym task {name!r}: config {config!r} is invalid ({exc}); its settings: "
            f"{', '.join(settings) or '(none)'}"
        ) from None


@functools.lru_cache(maxsize=32)
def _dataset(key: str, seed: int, size: int) -> Any:
    """The reasoning-gym dataset for the spec ``key`` (shared by env instances; items are pure)."""
    rg = import_reasoning_gym()
    spec = json.loads(key)
    if "tasks" in spec:
        from reasoning_gym.composite import DatasetSpec

        parts = [
            DatasetSpec(name=name, weight=weight, config=dict(config))
            for name, (weight, config) in spec["tasks"].items()
        ]
        return rg.create_dataset("composite", seed=seed, size=size, datasets=parts)
    return rg.create_dataset(spec["task"], seed=seed, size=size, **spec["config"])


@functools.lru_cache(maxsize=32)
def _held_out(key: str, num_eval: int) -> tuple[list[Task], frozenset[str]]:
    """The held-out tasks of spec ``key`` and their questions (built once per process); an item
    reasoning-gym fails to make is passed over for the next one (at most RETRIES times)."""
    dataset, name, tasks, failed = _dataset(key, EVAL_SEED, num_eval), spec_name(key), [], 0
    while len(tasks) < num_eval:
        try:
            tasks.append(make_task(dataset, name, "held-out", len(tasks) + failed))
        except EnvLibraryError:
            failed += 1
            if failed >= RETRIES:
                raise
    return tasks, frozenset(t["question"] for t in tasks)


def spec_name(key: str) -> str:
    """The task name of spec ``key``, or its mix's names joined by ``+`` (for messages)."""
    spec = json.loads(key)
    return spec.get("task") or "+".join(spec["tasks"])


def entry_task(entry: Mapping[str, Any]) -> Task:
    """A reasoning-gym entry as a task: ``question``, ``answer`` and ``metadata``."""
    return {"question": entry["question"], "answer": entry["answer"], "metadata": entry.get("metadata", {})}


def make_task(dataset: Any, name: str, split: str, index: int) -> Task:
    """Item ``index`` of ``dataset`` as a task; an exception inside reasoning-gym (codeio's
    ``json.dumps`` of a sympy ``Integer``...) is an EnvLibraryError naming the task and the item."""
    with library_call("reasoning_gym", name, f"{split} item {index}"):
        return entry_task(dataset[index])


class TrainTasks(LazyTasks):
    """Training items on demand; one whose question is held out, or that reasoning-gym fails to
    make, is replaced by another training item."""

    def __init__(self, dataset: Any, held_out: frozenset[str], seed: int, name: str) -> None:
        super().__init__(TRAIN_SIZE)
        self.dataset, self.held_out, self.seed, self.name = dataset, held_out, seed, name

    def make(self, index: int) -> Task:
        """Training task ``index``."""
        failure: EnvLibraryError | None = None
        for k in range(RETRIES):
            try:
                task = make_task(self.dataset, self.name, "training", (index + k * STRIDE) % TRAIN_SIZE)
            except EnvLibraryError as exc:
                failure = exc
                continue
            if task["question"] not in self.held_out:
                return task
        if failure is not None:
            draws = f"{RETRIES} draw{'s' if RETRIES != 1 else ''}"
            raise EnvLibraryError(
                f"{failure} ({draws} for training item {index}: each failed or was held out)"
            ) from failure
        raise EnvError(
            f"reasoning_gym: training item {index} repeated a held-out question {RETRIES} times; "
            "the task has too few distinct questions: lower num_eval or widen its config"
        )


@dataclasses.dataclass(frozen=True)
class ReasoningGymArgs:
    """The ``reasoning_gym`` env's ``env_args`` with a range or a type to keep (see
    :class:`ReasoningGymEnv`), each checked against its declared rule when made: a bad one is a
    one-line ConfigError ``reasoning_gym: KEY must be ..., got VALUE``. ``system_prompt`` (its
    message names the library's prompts) and the task names are checked in code."""

    seed: Annotated[int, Field(ge=0, lt=MAX_SEED), Allowed(f"an int in [0, {MAX_SEED})")]
    num_eval: Annotated[int, Field(ge=1), Allowed("an int >= 1")]
    answer_fallback: Annotated[str, OneOf("none", "lenient"), Allowed("'none' or 'lenient'")]
    config: Annotated[dict[Any, Any] | None, Allowed("a mapping of dataset settings")]

    def __post_init__(self) -> None:
        """Raise ConfigError naming the first bad argument, its value and what is allowed."""
        check_declared(self, prefix="reasoning_gym: ")


@dataclasses.dataclass(frozen=True)
class TaskWeight:
    """A task's weight in a ``tasks`` mix."""

    weight: Annotated[float, Field(gt=0), Allowed("a number > 0")]


class ReasoningGymEnv(Env):
    """A reasoning-gym task (or weighted mix) scored by its own ``score_answer`` (module docstring).

    Args:
        task: a reasoning-gym task name (``leg_counting``, ``basic_arithmetic``...).
        config: that task's dataset config (``{min_animals: 2, max_animals: 3}``); reasoning-gym's
            defaults otherwise.
        tasks: instead of ``task``, a weighted mix: ``{NAME: weight}`` or
            ``{NAME: {weight: w, config: {...}}}``.
        seed: seeds the training items (in [0, 10**9)); the held-out split never moves.
        num_eval: held-out items for ``agentrl eval``.
        system_prompt: a key of ``reasoning_gym.utils.SYSTEM_PROMPTS`` ("default", "simple",
            "direct", "DeepSeekZero", "chain_of_draft"), or the text of your own; it must tell
            the model to answer in ``<answer>`` tags.
        answer_fallback: ``none`` (reasoning-gym's rule: no tags, no answer) or ``lenient`` (a
            reply without tags is scored by its last ``\\boxed{}`` or last number).
    """

    max_turns = 1

    def __init__(
        self,
        task: str | None = "basic_arithmetic",
        config: dict[str, Any] | None = None,
        tasks: dict[str, Any] | None = None,
        seed: int = 0,
        num_eval: int = 128,
        system_prompt: str = "default",
        answer_fallback: str = "none",
    ) -> None:
        super().__init__()
        import_reasoning_gym()
        from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

        self._extract_answer = extract_answer
        ReasoningGymArgs(seed=seed, num_eval=num_eval, answer_fallback=answer_fallback, config=config)
        if not isinstance(system_prompt, str) or not system_prompt.strip():
            raise ConfigError(
                f"reasoning_gym: system_prompt must be a key of SYSTEM_PROMPTS "
                f"({', '.join(SYSTEM_PROMPTS)}) or a non-empty text, got {system_prompt!r}"
            )
        self.system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt)
        self.answer_fallback = answer_fallback
        spec = self._spec(task, config, tasks)
        key = _spec_key(spec)
        self.dataset = _dataset(key, seed, TRAIN_SIZE)
        self._eval, held_out = _held_out(key, num_eval)
        self.name = spec_name(key)
        self._train = TrainTasks(self.dataset, held_out, seed, self.name)

    @staticmethod
    def _spec(task: str | None, config: dict[str, Any] | None, tasks: dict[str, Any] | None) -> dict[str, Any]:
        """The validated dataset spec (``config`` is None or a mapping: see :class:`ReasoningGymArgs`):
        ``{"task", "config"}`` or ``{"tasks": {name: (weight, config)}}``."""
        for settings in [config or {}] + [v.get("config") or {} for v in (tasks or {}).values() if isinstance(v, dict)]:
            if isinstance(settings, dict) and {"seed", "size"} & set(settings):
                raise ConfigError(
                    "reasoning_gym: set env_args.seed / env_args.num_eval, not seed or size "
                    f"inside a task config (got {settings!r})"
                )
        if tasks is None:
            if task is None:
                raise ConfigError("reasoning_gym: set env_args.task=NAME or env_args.tasks={NAME: weight, ...}")
            check_config(check_task_name(task), dict(config or {}))
            return {"task": task, "config": dict(config or {})}
        if config:
            raise ConfigError(
                "reasoning_gym: with env_args.tasks give each task's config inside it "
                "({NAME: {weight: 1, config: {...}}}), not env_args.config"
            )
        if not isinstance(tasks, dict) or not tasks:
            raise ConfigError(f"reasoning_gym: tasks must be a non-empty mapping NAME -> weight, got {tasks!r}")
        mix = {}
        for name, value in tasks.items():
            check_task_name(name)
            weight, sub_config = (
                (value.get("weight", 1.0), value.get("config", {})) if isinstance(value, dict) else (value, {})
            )
            check_declared(TaskWeight(weight=weight), prefix=f"reasoning_gym: tasks.{name} ")
            if not isinstance(sub_config, dict):
                raise ConfigError(f"reasoning_gym: tasks.{name}.config must be a mapping, got {sub_config!r}")
            check_config(name, sub_config)
            mix[name] = (float(weight), sub_config)
        return {"tasks": mix}

    def train_tasks(self) -> Sequence[Task]:
        """Seeded training items, made on demand (100,000), none sharing a held-out question."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """``num_eval`` held-out items (generator seeds from EVAL_SEED on)."""
        return self._eval

    def start(self, task: Task) -> list[Message]:
        """reasoning-gym's system prompt (answer format) and the question."""
        if not isinstance(task.get("question"), str):
            raise EnvError(f"reasoning_gym: a task needs a string 'question', got keys {sorted(task)}")
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task["question"]}]

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score the reply's last ``<answer>`` span with the dataset's ``score_answer``; the episode ends."""
        if self.task is None:
            raise EnvError("reasoning_gym: respond() called before reset()")
        answer = tagged = self._extract_answer(text)
        if answer is None and self.answer_fallback == "lenient":
            answer = lenient_answer(text)
        info: dict[str, Any] = {"answer": answer}
        try:
            score = float(self.dataset.score_answer(answer, self.task))
        except Exception as exc:  # a scorer crash on odd model output is data, not a crash
            score, info["score_error"] = 0.0, repr(exc)
        info.update(
            score=score,
            success=score >= 1.0,
            metrics={"answer_tagged": float(tagged is not None), "solved": float(score >= 1.0)},
        )
        return [], score, True, info

    def gold_reply(self, task: Task) -> str | None:
        """``<answer>ANSWER</answer>``; None for tasks with no single answer (graph_color, rubiks_cube...)."""
        answer = task.get("answer")
        return None if answer is None else f"<answer>{answer}</answer>"


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register ``reasoning_gym``."""
    register("reasoning_gym", ReasoningGymEnv)


__all__ = ["ReasoningGymArgs", "ReasoningGymEnv", "task_names"]
