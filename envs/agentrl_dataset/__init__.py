"""The ``dataset`` env: one turn on a dataset row's prompt (``agentrl train --dataset tasks.jsonl``).

A row's prompt is its ``prompt`` column (else ``messages``, else ``question``; ``env_args.prompt_field``
names another): a string becomes the user message, a list of chat messages opens the episode as it
is. The model replies once. With an ``answer`` column the env scores the reply itself: 1.0 when
its answer (the last ``\\boxed{}``, else the whole reply) equals the row's answer (mathematically
for numbers, case- and space-insensitively for text), else 0.0, and the held-out accuracy counts
those; without one the reward functions given with ``--reward`` score it (TRL-style functions
receive every other column as keyword arguments), and a run given none is refused at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentrl import ConfigError, Env, Message, Task, hookimpl
from agentrl.answers import answers_match, extract_boxed

PROMPT_FIELDS = ("prompt", "messages", "question")
"""The columns taken as a row's prompt when ``prompt_field`` is not given, in this order."""


class DatasetEnv(Env):
    """Single-turn episodes on rows of a dataset (the run's ``dataset`` section gives the rows).

    Args:
        prompt_field: the column holding the prompt (a string, or a list of chat messages); None:
            the first of :data:`PROMPT_FIELDS` the rows have.
        answer_field: the column holding the reference answer the env scores against (rows
            without it are scored by the reward functions alone).
        system_prompt: a system message opening each episode whose prompt has none.
    """

    max_turns = 1
    default_rewards: dict[str, float] = {}

    def __init__(
        self, prompt_field: str | None = None, answer_field: str = "answer", system_prompt: str | None = None
    ) -> None:
        super().__init__()
        self.prompt_field, self.answer_field, self.system_prompt = prompt_field, answer_field, system_prompt
        self._train: Sequence[Task] | None = None
        self._eval: Sequence[Task] = []

    def use_tasks(self, train: Sequence[Task], held_out: Sequence[Task]) -> None:
        """Take the dataset's rows, checking each has the prompt column (chosen from the first row
        when ``prompt_field`` is not given); the env scores episodes when every row has an answer."""
        rows = [*train, *held_out]
        if self.prompt_field is None:
            found = [name for name in PROMPT_FIELDS if name in rows[0]]
            if not found:
                raise ConfigError(
                    f"dataset rows have no {' / '.join(map(repr, PROMPT_FIELDS))} column (columns: "
                    f"{', '.join(rows[0]) or 'none'}); name the prompt's with --set env_args.prompt_field=COLUMN"
                )
            self.prompt_field = found[0]
        for number, row in enumerate(rows, 1):
            if not isinstance(row.get(self.prompt_field), (str, list)) or not row[self.prompt_field]:
                raise ConfigError(
                    f"dataset row {number}: {self.prompt_field!r} must be a non-empty string or a list of "
                    f"chat messages, got {row.get(self.prompt_field)!r:.80}"
                )
        self.scores_episodes = all(row.get(self.answer_field) not in (None, "") for row in rows)
        self._train, self._eval = train, held_out

    def train_tasks(self) -> Sequence[Task]:
        """The dataset's training rows."""
        if self._train is None:
            raise ConfigError("the dataset env takes its tasks from a dataset: agentrl train --dataset tasks.jsonl")
        return self._train

    def eval_tasks(self) -> Sequence[Task]:
        """The dataset's held-out rows."""
        return self._eval

    def start(self, task: Task) -> list[Message]:
        """The row's prompt as the opening messages (after ``system_prompt`` when it has none)."""
        prompt = task[self.prompt_field or next(name for name in PROMPT_FIELDS if name in task)]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def respond(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """End the episode; 1.0 for a reply whose answer equals the row's, else 0.0 (0.0 and no
        verdict for a row without an answer)."""
        assert self.task is not None
        gold = self.task.get(self.answer_field)
        if gold in (None, ""):
            return [], 0.0, True, {}
        correct = reply_matches(text, str(gold))
        return [], float(correct), True, {"correct": correct}

    def gold_reply(self, task: Task) -> str | None:
        """``\\boxed{answer}`` for a row with an answer; None (nothing to check) otherwise."""
        gold = task.get(self.answer_field)
        return None if gold in (None, "") else f"\\boxed{{{gold}}}"


def reply_matches(text: str, gold: str) -> bool:
    """Whether ``text``'s answer (its last ``\\boxed{}``, else all of it) is ``gold``: mathematically
    equal, or the same text ignoring case and surrounding space."""
    answer = extract_boxed(text)
    answer = (answer if answer is not None else text).strip()
    return answer.casefold() == gold.strip().casefold() or answers_match(answer, gold)


@hookimpl
def agentrl_register_envs(register: Callable[..., None]) -> None:
    """Register the ``dataset`` env."""
    register("dataset", DatasetEnv)


__all__ = ["PROMPT_FIELDS", "DatasetEnv", "reply_matches"]
