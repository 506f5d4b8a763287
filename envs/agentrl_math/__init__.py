"""``math``: single-turn arithmetic, the default task (gymnasium id ``agentrl/Math-v0``).

The model sees one question ("What is 7 + 5? Put the final answer in \\boxed{}.") and answers
once. The env's reward is lenient correctness: the answer in the last ``\\boxed{}`` if there is
one, else the last number in the reply, checked against the gold answer with math-verify.

Told to, the tiny default model rarely writes ``\\boxed{}`` (greedy: 0 of 64 held-out problems;
about 3% of its samples at T=1), so ``default_rewards`` add two terms to the env's reward:
``format`` (1.0 for a number in ``\\boxed{}``, right or wrong) and ``accuracy`` (1.0 more when that
boxed number is correct):

==========================  =====  ======  ========  =====
reply                        env   format  accuracy  total
==========================  =====  ======  ========  =====
correct, in ``\\boxed{}``    1.0     1.0      1.0      3.0
correct, not boxed            1.0     0.0      0.0      1.0
wrong, in ``\\boxed{}``      0.0     1.0      0.0      1.0
wrong, not boxed              0.0     0.0      0.0      0.0
==========================  =====  ======  ========  =====

A wrong answer never earns more than a correct one, and once every reply is boxed the total is 1
+ 2 x correct: pure correctness. The format terms weigh as much as the env's own reward so that the
few boxed samples (3%) outweigh the pull toward short unboxed answers before the policy settles on
those: at 0.5 each the format was learned on every seed in bf16 but on about half in fp32 (docs/benchmarks/hardware.md),
where the sampler follows every update and its entropy falls within ten steps. The ungated part
is what makes the habit learnable: with only the gated bonus (``--reward accuracy:1``) boxed samples were too rare to
pay and the model stopped boxing altogether (docs/benchmarks/learning.md). ``demonstration`` shows one solved problem
first instead: every greedy answer is then boxed from the start, but the policy's entropy collapsed within
ten steps and held-out accuracy stopped improving (same section). Every episode reports
``info["metrics"]["boxed"]`` (``env/boxed``, ``eval/env/boxed``: the share of replies with a ``\\boxed{}``).

Tasks come from a procedural generator (``difficulty``) or a JSONL file (``data_file``). The
held-out eval split is fixed by :data:`SPLIT_SEED`, not by ``seed``: a model trained with any
seed or any ``num_eval`` is never evaluated on a problem it trained on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from agentrl import Allowed, Complaint, Env, EnvError, LazyTasks, Message, OneOf, Task, check_declared, hookimpl
from agentrl.answers import answers_match, extract_answer, extract_boxed

INSTRUCTION = "Put the final answer in \\boxed{}."
"""Appended to every question that does not already ask for ``\\boxed{}``."""
SPLIT_SEED = 20261122
"""Seed of the train/eval split; independent of ``seed`` so the split never moves."""
MAX_HELD_OUT = 1024
"""At most this many generated problems are held out (fewer for small levels: a third)."""
NUM_TRAIN_TASKS = 100_000
"""Length of the generated training sequence (problems repeat; order is seeded)."""
DATA_EVAL_FRACTION = 0.1
"""Share of a data file's distinct questions held out for eval (at least one)."""
DEMONSTRATION: list[Message] = [
    {"role": "user", "content": f"What is 104 + 3? {INSTRUCTION}"},
    {"role": "assistant", "content": "104 + 3 = 107. The final answer is \\boxed{107}."},
]
"""The worked example shown before the question (``demonstration=True``): a problem outside every
generated level, so it is never a training or held-out task."""


# -- task sources --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Level:
    """A procedural difficulty level: operand ranges and operators."""

    a: range
    b: range
    ops: tuple[str, ...]

    @property
    def size(self) -> int:
        """Number of distinct problems."""
        return len(self.ops) * len(self.a) * len(self.b)

    def problem(self, index: int) -> Task:
        """Problem number ``index`` in 0..size-1 as a task dict."""
        op_i, rest = divmod(index, len(self.a) * len(self.b))
        a_i, b_i = divmod(rest, len(self.b))
        a, b, op = self.a[a_i], self.b[b_i], self.ops[op_i]
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return {"question": f"What is {a} {op} {b}? {INSTRUCTION}", "answer": str(value), "a": a, "op": op, "b": b}


LEVELS: dict[str, Level] = {
    "single_digit": Level(range(10), range(10), ("+", "-")),
    "two_digit": Level(range(10, 100), range(10), ("+", "-")),
    "mixed": Level(range(10, 100), range(10, 100), ("+", "-", "*")),
}


class GeneratedTasks(LazyTasks):
    """``length`` training problems, item ``i`` drawn deterministically from ``(seed, i)``."""

    def __init__(self, level: Level, problem_ids: np.ndarray, seed: int, length: int) -> None:
        super().__init__(length)
        self.level, self.problem_ids, self.seed = level, problem_ids, seed

    def make(self, i: int) -> Task:
        """Problem ``i``: a deterministic draw from ``(seed, i)``."""
        pick = np.random.default_rng([self.seed, i]).integers(len(self.problem_ids))
        return self.level.problem(int(self.problem_ids[pick]))


def load_jsonl(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file: one object per line with ``question`` and ``answer`` fields."""
    path = Path(path)
    if not path.is_file():
        raise EnvError(f"math data_file {str(path)!r} does not exist or is not a file")
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvError(f"math data_file {str(path)!r} could not be read as UTF-8 text: {exc}") from None
    tasks = []
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EnvError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise EnvError(f"{where}: expected a JSON object, got {type(row).__name__}")
        question, answer = row.get("question"), row.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise EnvError(f"{where}: 'question' must be a non-empty string, got {question!r}")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
            raise EnvError(f"{where}: 'answer' must be a non-empty string or number, got {answer!r}")
        tasks.append({**row, "answer": str(answer).strip()})
    distinct = len({t["question"] for t in tasks})
    if distinct < 2:
        raise EnvError(
            f"{path}: needs at least 2 distinct questions (one to train on, one to hold out), found {distinct}"
        )
    return tasks


def split_tasks(tasks: list[Task], fraction: float = DATA_EVAL_FRACTION) -> tuple[list[Task], list[Task]]:
    """(train, eval): a fixed seeded ``fraction`` of distinct questions (at least 1) held out."""
    questions = sorted({t["question"] for t in tasks})
    n_eval = max(1, int(len(questions) * fraction))
    order = np.random.default_rng(SPLIT_SEED).permutation(len(questions))
    held_out = {questions[i] for i in order[:n_eval]}
    return ([t for t in tasks if t["question"] not in held_out], [t for t in tasks if t["question"] in held_out])


# -- the environment -----------------------------------------------------------------------------
@dataclass(frozen=True)
class MathArgs:
    """The ``math`` env's ``env_args`` (see :class:`MathEnv`), each checked against its declared
    rule when made: a bad one is a one-line ConfigError ``math env: KEY must be ..., got VALUE``."""

    difficulty: Annotated[str, OneOf(*LEVELS), Complaint("{key} {value!r} is not {allowed}")]
    seed: Annotated[int, Field(ge=0), Allowed("an int >= 0", wrong_type="an int")]
    num_eval: Annotated[int, Field(ge=1), Allowed("an int >= 1")]
    system_prompt: Annotated[str | None, Allowed("a string or None")]
    demonstration: Annotated[bool, Allowed("true or false")]
    data_file: Annotated[str | Path | None, Allowed("a path string or None")]

    def __post_init__(self) -> None:
        """Raise ConfigError naming the first bad argument, its value and what is allowed."""
        check_declared(self, prefix="math env: ")


class MathEnv(Env):
    """Single-turn arithmetic: reward 1.0 for a correct final answer (lenient parse), else 0.0.

    Args:
        difficulty: generated problems, one of ``LEVELS``: "single_digit" (a + b, a - b with
            a, b in 0..9; 200 problems), "two_digit" (two-digit +/- one-digit; 1,800),
            "mixed" (two-digit +, -, * two-digit; 24,300). Ignored when ``data_file`` is set.
        data_file: a JSONL file with ``question`` and ``answer`` fields (other columns are kept
            in the task); a seeded 10% of its distinct questions (at least one) is held out.
        seed: seeds the order of the generated training problems.
        num_eval: at most this many held-out problems for eval. Generated levels hold out a
            third of their problems, at most 1,024 (single_digit: 66); asking for more gives
            all of them. Training never sees any held-out problem, whatever ``num_eval``.
        system_prompt: if set, a system message opens each episode.
        demonstration: show one solved problem (:data:`DEMONSTRATION`, answer in ``\\boxed{}``)
            before the question (off by default: see above).

    Raises ConfigError for a bad argument and EnvError for a bad data file (naming file and line).
    """

    max_turns = 1
    default_rewards = {"format": 1.0, "accuracy": 1.0}

    def __init__(
        self,
        difficulty: str = "single_digit",
        data_file: str | None = None,
        seed: int = 0,
        num_eval: int = 128,
        system_prompt: str | None = None,
        demonstration: bool = False,
    ) -> None:
        super().__init__()
        MathArgs(
            difficulty=difficulty,
            seed=seed,
            num_eval=num_eval,
            system_prompt=system_prompt,
            demonstration=demonstration,
            data_file=data_file,
        )
        self.difficulty, self.data_file, self.seed = difficulty, data_file, seed
        self.num_eval, self.system_prompt, self.demonstration = num_eval, system_prompt, demonstration
        self._train: Sequence[Task]
        self._eval: Sequence[Task]
        if data_file is not None:
            train, held_out = split_tasks(load_jsonl(data_file))
            order = np.random.default_rng(seed).permutation(len(train))
            self._train, self._eval = [train[i] for i in order], held_out[:num_eval]
        else:
            level = LEVELS[difficulty]
            ids = np.random.default_rng(SPLIT_SEED).permutation(level.size)
            n_held = min(level.size // 3, MAX_HELD_OUT)
            self._eval = [level.problem(int(i)) for i in ids[: min(num_eval, n_held)]]
            self._train = GeneratedTasks(level, ids[n_held:], seed, NUM_TRAIN_TASKS)

    def train_tasks(self) -> Sequence[Task]:
        """Training problems (generated lazily, or the data file's training split, seeded order)."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """Held-out problems, disjoint from ``train_tasks`` by question."""
        return self._eval

    def start(self, task: Task) -> list[Message]:
        """The question as a user message (asking for ``\\boxed{}``), after the system prompt if any."""
        question, answer = task.get("question"), task.get("answer")
        if not isinstance(question, str) or answer is None:
            raise EnvError(f"math env: a task needs a string 'question' and an 'answer', got keys {sorted(task)}")
        content = question if "\\boxed" in question else f"{question} {INSTRUCTION}"
        messages = [*(dict(m) for m in DEMONSTRATION if self.demonstration), {"role": "user", "content": content}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score the one reply: 1.0 if correct (lenient parse), else 0.0; the episode ends."""
        if self.task is None:
            raise EnvError("math env: respond() called before reset()")
        parsed = extract_answer(text)
        correct = answers_match(parsed, str(self.task["answer"]))
        boxed = extract_boxed(text) is not None
        info = {"correct": correct, "parsed": parsed, "boxed": boxed, "metrics": {"boxed": float(boxed)}}
        return [], 1.0 if correct else 0.0, True, info


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register ``math``."""
    register("math", MathEnv)
