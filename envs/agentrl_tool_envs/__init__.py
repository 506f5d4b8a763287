"""Built-in tool-using envs: ``calculator`` (arithmetic through a calculator tool) and ``python``
(questions answered by running code in ``agentrl.tools.sandbox``).

Both are ``agentrl.ToolEnv``s: the model calls tools with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (or a registered ``tool_parser``),
gets ``tool`` messages back, and ends the episode with an answer without a tool call. Reward 1.0
when the answer (the last ``\\boxed{}`` if any, else the last number) equals the gold, else 0.
Tasks are procedural: task ``i`` comes from an RNG seeded by ``(task_seed, i)``; the held-out
eval tasks come from a fixed seed, and a training task whose question is an eval question is
redrawn, so the splits are disjoint.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from agentrl import (
    HARMONY,
    LLAMA3_JSON,
    MISTRAL,
    QWEN3_CODER,
    Allowed,
    EnvError,
    LazyTasks,
    Message,
    Task,
    Tool,
    ToolEnv,
    ToolError,
    check_declared,
    format_tool_call,
    hookimpl,
    parse_xml_json,
    seeded_rng,
)
from agentrl import run_python as sandbox_run_python

EVAL_SEED = 987_654_321
TRAIN_SIZE = 1_000_000
MAX_EVAL = 10_000
"""Most held-out tasks: training tasks are redrawn away from all of them, so they are built up front."""
MAX_EXPRESSION_CHARS = 300
MAX_RESULT_DIGITS = 1000


class ProceduralTasks(LazyTasks):
    """Tasks made on demand: ``tasks[i]`` is ``make(rng)`` with an RNG seeded by ``(seed, i)``,
    plus an ``id`` (``NAME-SEED-i``). A task whose question is in ``exclude`` (another split) is
    redrawn with the next sub-seed.
    """

    def __init__(
        self,
        make: Callable[[np.random.Generator], Task],
        name: str,
        seed: int,
        length: int,
        exclude: Sequence[Task] = (),
    ) -> None:
        super().__init__(length)
        self.draw, self.name, self.seed = make, name, seed
        self._exclude_source = exclude
        self._excluded: set[str] | None = None

    def make(self, index: int) -> Task:
        """Task ``index``, redrawn while its question is in the excluded split."""
        if self._excluded is None:
            self._excluded = {t["question"] for t in self._exclude_source}
        for attempt in range(256):
            task = self.draw(seeded_rng((self.seed << 48) + (index << 8) + attempt))
            if task["question"] not in self._excluded:
                return {"id": f"{self.name}-{self.seed}-{index}", **task}
        raise EnvError(f"could not draw task {index} outside the excluded split in 256 tries")


_TASK_SEED = f"a non-negative int other than {EVAL_SEED} (the eval split's)"


@dataclass(frozen=True)
class SplitArgs:
    """The ``env_args`` that set a tool env's task splits, each checked against its declared rule
    when made: a bad one is a one-line EnvError ``KEY must be ..., got VALUE``."""

    task_seed: Annotated[int, Field(ge=0), Allowed(_TASK_SEED)]
    num_eval: Annotated[int, Field(ge=1, le=MAX_EVAL), Allowed(f"a positive int <= {MAX_EVAL:,}")]

    def __post_init__(self) -> None:
        """Raise EnvError naming the first bad argument; ``task_seed`` must not be the eval split's."""
        check_declared(self, error=EnvError)
        if self.task_seed == EVAL_SEED:
            raise EnvError(f"task_seed must be {_TASK_SEED}, got {self.task_seed!r}")


@dataclass(frozen=True)
class ParserArg:
    """A tool env's ``tool_parser`` argument: a registered parser's name, a parser, or None."""

    tool_parser: Annotated[str | Callable[..., Any] | None, Allowed("a registered parser name")]


@dataclass(frozen=True)
class PythonArgs:
    """The ``python`` env's sandbox limits, checked against their declared rules when made: a bad
    one is a one-line EnvError ``PythonEnv: KEY must be ..., got VALUE``."""

    timeout_s: Annotated[float, Field(ge=0.01, le=3600), Allowed("a number of seconds in [0.01, 3600]")]
    memory_mb: Annotated[int, Field(ge=64), Allowed("an integer >= 64")]

    def __post_init__(self) -> None:
        """Raise EnvError naming the first bad limit, its value and what is allowed."""
        check_declared(self, prefix="PythonEnv: ", error=EnvError)


def task_splits(
    make: Callable[[np.random.Generator], Task], name: str, task_seed: int, num_eval: int
) -> tuple[ProceduralTasks, ProceduralTasks]:
    """(train, eval) procedural splits: eval from ``EVAL_SEED``, train redrawn away from it."""
    SplitArgs(task_seed=task_seed, num_eval=num_eval)
    eval_tasks = ProceduralTasks(make, name, EVAL_SEED, num_eval)
    return ProceduralTasks(make, name, task_seed, TRAIN_SIZE, exclude=eval_tasks), eval_tasks


_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The last number in the last ``\\boxed{...}``, else in ``text``; commas dropped."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    numbers = _NUMBER.findall(boxed[-1] if boxed else text) or (_NUMBER.findall(text) if boxed else [])
    return numbers[-1].replace(",", "") if numbers else None


def answer_matches(text: str, gold: str) -> bool:
    """True if the answer extracted from ``text`` equals the number ``gold`` (integers exactly)."""
    value = extract_answer(text)
    if value is None:
        return False
    if "." not in value and "." not in gold:
        return int(value) == int(gold)
    return math.isclose(float(value), float(gold), rel_tol=1e-9, abs_tol=1e-9)


# ---------------------------------------------------------------------------------------------
# Calculator


_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_ALLOWED = "numbers, + - * / // % **, parentheses and unary minus"


def evaluate_arithmetic(expression: str) -> int | float:
    """Evaluate an arithmetic expression by walking its syntax tree (never ``eval``).

    Allowed: int and float literals, ``+ - * / // % **``, parentheses, unary ``-``/``+``.
    ValueError for anything else, an expression over ``MAX_EXPRESSION_CHARS`` characters, or a
    result over ``MAX_RESULT_DIGITS`` digits (``**`` is checked before it is computed).
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression has {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r} ({exc.msg})") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if (
            isinstance(node.op, ast.Pow)
            and abs(left) > 1
            and (abs(right) > 10_000 or right * math.log10(abs(left)) > MAX_RESULT_DIGITS)
        ):
            raise ValueError(f"{left} ** {right} is too large (at most {MAX_RESULT_DIGITS} digits)")
        try:
            result = _OPS[type(node.op)](left, right)
        except OverflowError:
            raise ValueError("result too large") from None
        if isinstance(result, complex):
            raise ValueError("result is not a real number")
        if isinstance(result, int) and result.bit_length() > MAX_RESULT_DIGITS * 3.33:
            raise ValueError(f"result has more than {MAX_RESULT_DIGITS} digits")
        return result
    raise ValueError(f"{type(node).__name__} is not allowed; use only {_ALLOWED}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: The expression, with numbers, + - * / // % ** and parentheses, e.g. "(23 * 7) - 48".
    """
    result = evaluate_arithmetic(expression)
    return format(result, ".12g") if isinstance(result, float) else str(result)


def make_arithmetic_task(rng: np.random.Generator) -> Task:
    """Two or three operations (+, -, *) on multi-digit numbers, e.g. ``(23 * 7) - 48``."""
    expression = str(int(rng.integers(10, 100)))
    for step in range(int(rng.integers(2, 4))):
        op = str(rng.choice(["+", "-", "*"]))
        number = int(rng.integers(2, 100)) if op == "*" else int(rng.integers(10, 1000))
        inner = f"({expression})" if step else expression
        expression = f"{inner} {op} {number}" if rng.random() < 0.6 else f"{number} {op} {inner}"
    answer = str(evaluate_arithmetic(expression))
    question = f"What is {expression}? Give the final answer as \\boxed{{N}}."
    return {"question": question, "answer": answer, "expression": expression}


def worked_example(question: str, tool_name: str, arguments: dict[str, Any], result: str) -> list[Message]:
    """A demonstration: the question, one tool call, its result, the boxed answer."""
    return [
        {"role": "user", "content": f"{question} Give the final answer as \\boxed{{N}}."},
        {"role": "assistant", "content": format_tool_call(tool_name, **arguments)},
        {"role": "tool", "name": tool_name, "content": result},
        {"role": "assistant", "content": f"\\boxed{{{result}}}"},
    ]


class AnswerToolEnv(ToolEnv):
    """A tool env over procedural (train, eval) splits, scored by the final number's exactness.

    Its default rewards add ``tool_use`` (0.2) to the env's 0/1: without it the default model,
    which rarely calls a tool at first, would get no signal until it solved a task.
    """

    default_rewards = {"tool_use": 0.2}
    _train: Sequence[Task]
    _eval: Sequence[Task]

    def __init__(self, **kwargs: Any) -> None:
        check_declared(
            ParserArg(tool_parser=kwargs.get("tool_parser")), prefix=f"{type(self).__name__}: ", error=EnvError
        )
        super().__init__(**kwargs)

    def train_tasks(self) -> Sequence[Task]:
        """Procedural training tasks (1,000,000, made on demand)."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """``num_eval`` held-out tasks."""
        return self._eval

    def score_answer(self, text: str) -> float:
        """1.0 if the final number equals the gold answer, else 0.0."""
        return float(answer_matches(text, self.task["answer"])) if self.task else 0.0


class CalculatorEnv(AnswerToolEnv):
    """Multi-step arithmetic with a ``calculator`` tool; reward 1.0 for the right final number."""

    tools = (Tool(calculator),)
    instructions = (
        "Solve the arithmetic problem. Use the calculator tool instead of computing "
        "in your head, then give the final answer as \\boxed{N}."
    )
    demonstrations = (
        worked_example("What is 12 * 34 + 5?", "calculator", {"expression": "12 * 34 + 5"}, "413"),
        worked_example("What is 7 - 250 * 3?", "calculator", {"expression": "7 - 250 * 3"}, "-743"),
    )

    def __init__(self, task_seed: int = 0, num_eval: int = 200, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._train, self._eval = task_splits(make_arithmetic_task, "calculator", task_seed, num_eval)


# ---------------------------------------------------------------------------------------------
# Python


def _primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, math.isqrt(n - 1) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n, i)))
    return sum(sieve)


def _fibonacci(k: int) -> int:
    a, b = 0, 1
    for _ in range(k):
        a, b = b, a + b
    return a


def make_code_task(rng: np.random.Generator) -> Task:
    """A question whose answer is easiest found by running a few lines of Python."""
    kind = int(rng.integers(5))
    if kind == 0:
        a, b = int(rng.integers(2, 10)), int(rng.integers(20, 200))
        question, answer = f"What is the sum of the digits of {a}**{b}?", sum(map(int, str(a**b)))
    elif kind == 1:
        n = int(rng.integers(100, 10_000))
        question, answer = f"How many prime numbers are there below {n}?", _primes_below(n)
    elif kind == 2:
        a, b, m = int(rng.integers(2, 1000)), int(rng.integers(100, 10_000)), int(rng.integers(7, 1000))
        question, answer = f"What is the remainder when {a}**{b} is divided by {m}?", pow(a, b, m)
    elif kind == 3:
        n, a, b = int(rng.integers(1000, 100_000)), int(rng.integers(2, 20)), int(rng.integers(2, 20))
        count = n // a + n // b - n // math.lcm(a, b)
        question, answer = f"How many integers from 1 to {n} are divisible by {a} or by {b}?", count
    else:
        k = int(rng.integers(30, 120))
        suffix = "th" if k % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
        question = f"What is the {k}{suffix} Fibonacci number, with F(1) = F(2) = 1?"
        answer = _fibonacci(k)
    return {"question": f"{question} Give the final answer as \\boxed{{N}}.", "answer": str(answer)}


class PythonEnv(AnswerToolEnv):
    """Questions answered by running code with a ``run_python`` tool (in ``agentrl.tools.sandbox``)."""

    instructions = (
        "Answer the question. Write a short Python script that prints the answer, run "
        "it with the run_python tool, then give the final answer as \\boxed{N}."
    )
    demonstrations = (
        worked_example(
            "What is the sum of the digits of 2**15?",
            "run_python",
            {"code": "print(sum(int(d) for d in str(2**15)))"},
            "26",
        ),
        worked_example(
            "How many multiples of 7 are there from 1 to 100?",
            "run_python",
            {"code": "print(len([n for n in range(1, 101) if n % 7 == 0]))"},
            "14",
        ),
    )

    def __init__(
        self, task_seed: int = 0, num_eval: int = 200, timeout_s: float = 5.0, memory_mb: int = 512, **kwargs: Any
    ) -> None:
        PythonArgs(timeout_s=timeout_s, memory_mb=memory_mb)
        self.sandbox_limits = {"timeout_s": timeout_s, "memory_mb": memory_mb}
        super().__init__(tools=[Tool(self.run_python)], **kwargs)
        self._train, self._eval = task_splits(make_code_task, "python", task_seed, num_eval)

    def run_python(self, code: str) -> str:
        """Run a Python script in a sandbox and return what it prints.

        Args:
            code: The script. Only the standard library is available; print() the result.
        """
        result = sandbox_run_python(code, max_output_chars=self.max_tool_output_chars, **self.sandbox_limits)
        parts = [result.stdout.rstrip("\n")] if result.stdout else []
        if result.stderr:
            parts.append(f"stderr:\n{result.stderr.rstrip()}")
        output = "\n".join(parts)
        if result.error or result.exit_code != 0:
            reason = result.error or f"exit code {result.exit_code}"
            raise ToolError(f"the script failed ({reason})" + (f"\n{output}" if output else ""))
        return output or "(no output; print() the result)"


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register the ``calculator`` and ``python`` envs."""
    register("calculator", CalculatorEnv)
    register("python", PythonEnv)


@hookimpl
def agentrl_register_tool_parsers(register: Callable[..., None]) -> None:
    """Register the tool-call parsers: the default ``xml_json`` and the native formats
    ``llama3_json``, ``mistral``, ``qwen3_coder`` and ``harmony`` (gpt-oss)."""
    register("xml_json", parse_xml_json)
    register("llama3_json", LLAMA3_JSON)
    register("mistral", MISTRAL)
    register("qwen3_coder", QWEN3_CODER)
    register("harmony", HARMONY)


__all__ = [
    "AnswerToolEnv",
    "CalculatorEnv",
    "PythonArgs",
    "PythonEnv",
    "ProceduralTasks",
    "SplitArgs",
    "answer_matches",
    "calculator",
    "evaluate_arithmetic",
    "extract_answer",
    "make_arithmetic_task",
    "make_code_task",
    "task_splits",
]
