"""Built-in ``guess`` env: guess a secret number over several turns, without tools.

The user says "I'm thinking of a number between 1 and N. Guess it; answer with just the number."
Each wrong guess gets a user message "Higher." or "Lower."; a reply with no number gets a request
for one (it still costs a turn). The guess read from a reply is its last integer.

Unless ``demonstration=False``, the prompt first shows one game won by bisection, as earlier
turns of the conversation (prompt tokens, never trained on).

Reward: ``1.0 - turn_cost * (turns - 1)`` (never below 0) when the secret is guessed on turn
``turns``, so the first-turn guess scores 1.0 and, with the defaults (N = 16, ``turn_cost`` 0.1,
``max_turns`` 5), a binary search that needs all 5 turns scores 0.6; 0 if it is never guessed.
With ``consistency_bonus`` > 0, every wrong guess after the first that falls inside the range the
feedback left open also earns that bonus on its own turn (a per-turn reward: PPO with
``credit=turn`` credits it to that turn; the episode return is the sum).

``info["metrics"]`` sums the episode up so far (logged as ``env/...``): ``valid_frac``, the share
of replies holding a number in 1..N; ``consistent_frac``, the share of guesses after the first
that fall inside the range the feedback so far leaves open (a model that uses "Higher."/"Lower."
scores 1.0, one that ignores it about the open share of the range); ``solved``.

Tasks carry ``id``, ``secret``, ``n``, ``question`` and ``answer``. Training tasks
(``guess-train-SEED-i``) draw the secret from an RNG seeded by ``(task_seed, i)``; the held-out
eval tasks (``guess-eval-i``) are fixed, cycling through every secret 1..N in turn. Secrets
necessarily repeat across splits (there are only N); the splits are disjoint by ``id``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from agentrl import Allowed, Env, EnvError, LazyTasks, Message, Task, check_declared, hookimpl, seeded_rng

TRAIN_SIZE = 1_000_000


@dataclass(frozen=True)
class GuessArgs:
    """The ``guess`` env's ``env_args`` (see :class:`GuessEnv`), each checked against its declared
    rule when made: a bad one is a one-line EnvError ``GuessEnv: KEY must be ..., got VALUE``."""

    n: Annotated[
        int,
        Field(ge=2, le=10**9),
        Allowed("an integer in [2, 10**9]", wrong_type="an integer >= 2", too_low="an integer >= 2"),
    ]
    max_turns: Annotated[int, Field(ge=1), Allowed("an integer >= 1")]
    num_eval: Annotated[int, Field(ge=1), Allowed("an integer >= 1")]
    task_seed: Annotated[int, Field(ge=0), Allowed("an integer >= 0")]
    turn_cost: Annotated[float, Field(ge=0, le=1)]
    demonstration: Annotated[bool, Allowed("true or false")]
    consistency_bonus: Annotated[float, Field(ge=0, le=1), Allowed("a number in [0, 1]")]

    def __post_init__(self) -> None:
        """Raise EnvError naming the first bad argument, its value and what is allowed."""
        check_declared(self, prefix="GuessEnv: ", error=EnvError)


class GuessTasks(LazyTasks):
    """Guess tasks made on demand: a training split (seeded secrets) or the fixed eval split."""

    def __init__(self, split: str, n: int, length: int, task_seed: int = 0) -> None:
        super().__init__(length)
        self.split, self.n, self.task_seed = split, n, task_seed

    def make(self, index: int) -> Task:
        """Task ``index`` of the split."""
        if self.split == "eval":
            task_id, secret = f"guess-eval-{index}", index % self.n + 1
        else:
            task_id = f"guess-train-{self.task_seed}-{index}"
            secret = int(seeded_rng((self.task_seed << 32) + index).integers(1, self.n + 1))
        question = f"I'm thinking of a number between 1 and {self.n}. Guess it; answer with just the number."
        return {"id": task_id, "secret": secret, "n": self.n, "question": question, "answer": str(secret)}


_INTEGER = re.compile(r"-?\d+")


def parse_guess(text: str) -> int | None:
    """The last integer in ``text``, or None if it has none."""
    numbers = _INTEGER.findall(text)
    return int(numbers[-1]) if numbers else None


def demonstration_game(n: int, question: str) -> list[Message]:
    """A game won by bisection (secret ``n * 2 // 3``), shown before the real question: the
    default model answers in prose without it, and in no turn of 16 tokens gives a number."""
    secret, low, high = max(1, n * 2 // 3), 1, n
    messages: list[Message] = [{"role": "user", "content": question}]
    while True:
        guess = (low + high) // 2
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            return messages
        low, high = (guess + 1, high) if secret > guess else (low, guess - 1)
        messages.append({"role": "user", "content": "Higher." if secret > guess else "Lower."})


class GuessEnv(Env):
    """Guess a number in [1, n] from "Higher."/"Lower." feedback (see the module docstring)."""

    max_turns = 5

    def __init__(
        self,
        n: int = 16,
        max_turns: int = 5,
        turn_cost: float = 0.1,
        task_seed: int = 0,
        num_eval: int = 64,
        demonstration: bool = True,
        consistency_bonus: float = 0.0,
    ) -> None:
        super().__init__()
        GuessArgs(
            n=n,
            max_turns=max_turns,
            num_eval=num_eval,
            task_seed=task_seed,
            turn_cost=turn_cost,
            demonstration=demonstration,
            consistency_bonus=consistency_bonus,
        )
        self.n, self.max_turns, self.turn_cost = n, max_turns, float(turn_cost)
        self.consistency_bonus = float(consistency_bonus)
        self.demonstration = bool(demonstration)
        self._train = GuessTasks("train", n, TRAIN_SIZE, task_seed)
        self._eval = GuessTasks("eval", n, num_eval)

    def train_tasks(self) -> Sequence[Task]:
        """Training tasks with seeded secrets (1,000,000, made on demand)."""
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """``num_eval`` fixed held-out tasks, cycling through the secrets 1..n."""
        return self._eval

    def start(self, task: Task) -> list[Message]:
        """The user's opening message."""
        for key in ("secret", "n", "question"):
            if key not in task:
                raise EnvError(f"GuessEnv: task needs a {key!r} key, got keys {sorted(task)}")
        self._open = (1, int(task["n"]))  # the range the feedback so far leaves open
        self._valid = self._followups = self._consistent = 0
        shown = demonstration_game(int(task["n"]), str(task["question"])) if self.demonstration else []
        return shown + [{"role": "user", "content": str(task["question"])}]

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Compare the guess in ``text`` with the secret; reply "Higher."/"Lower." or end."""
        if self.task is None:
            raise EnvError("GuessEnv.respond called before reset()")
        secret, n = int(self.task["secret"]), int(self.task["n"])
        guess = parse_guess(text)
        if guess is None or not 1 <= guess <= n:
            ask = f"Please answer with just a number between 1 and {n}."
            return [{"role": "user", "content": ask}], 0.0, False, self._info(guess, "invalid", False)
        low, high = self._open
        consistent = self._valid > 0 and low <= guess <= high
        self._followups += self._valid > 0
        self._consistent += consistent
        self._valid += 1
        if guess == secret:
            reward = max(0.0, 1.0 - self.turn_cost * (self.turn - 1))
            return [], reward, True, self._info(guess, "correct", True)
        feedback = "higher" if secret > guess else "lower"
        self._open = (max(low, guess + 1), high) if feedback == "higher" else (low, min(high, guess - 1))
        bonus = self.consistency_bonus if consistent else 0.0
        return (
            [{"role": "user", "content": f"{feedback.capitalize()}."}],
            bonus,
            False,
            self._info(guess, feedback, False),
        )

    def _info(self, guess: int | None, feedback: str, solved: bool) -> dict[str, Any]:
        metrics = {"valid_frac": self._valid / self.turn, "solved": float(solved)}
        if self._followups:
            metrics["consistent_frac"] = self._consistent / self._followups
        # "success" is what evaluation counts as solved (the env return is > 0 without a win when
        # consistency_bonus pays for consistent guesses).
        return {"guess": guess, "feedback": feedback, "success": solved, "metrics": metrics}


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register the ``guess`` env."""
    register("guess", GuessEnv)


__all__ = ["GuessArgs", "GuessEnv", "GuessTasks", "parse_guess"]
