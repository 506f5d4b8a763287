"""What every tracker implements, and the completions table's rows."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

COLUMNS = ("step", "group", "prompt", "completion", "reward", "answer")
"""The completions table's columns, in order."""


class Tracker(abc.ABC):
    """One tracker's run: started by the constructor, logged to per step, finished at the end.

    ``settings`` is the ``plugins.trackers`` section, ``config`` the run config as plain data and
    ``resume_id`` the tracker run id an earlier start in this run dir stored (None: a new run).
    Any exception a method raises turns the tracker off for the rest of the run (warned once).
    """

    run_id: str | None = None
    """The tracker's id of its run, stored in the run dir so ``--resume`` continues it."""

    @abc.abstractmethod
    def __init__(self, settings: Any, run_dir: Path, config: dict[str, Any], resume_id: str | None) -> None:
        """Start (or, with ``resume_id``, continue) the tracker's run."""

    @abc.abstractmethod
    def log_step(self, step: int, scalars: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """Log the step's scalars and, when ``rows`` is not empty, its completions table."""

    @abc.abstractmethod
    def finish(self, step: int, final: dict[str, float]) -> None:
        """Log the final metrics (``final/<key>``) and end the tracker run."""


def run_name(settings: Any, run_dir: Path) -> str:
    """The tracker run's name: ``run_name`` or the run dir's name."""
    return settings.run_name or run_dir.resolve().name


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: their text joined)."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)


def split_messages(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(prompt, completion) text of a conversation: the messages before the model's first one, and
    the rest (after the first, each prefixed by its role when the episode has several turns)."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    prompt = "\n\n".join(_text(m.get("content")) for m in messages[:first])
    rest = messages[first:]
    if len(rest) == 1:
        return prompt, _text(rest[0].get("content"))
    return prompt, "\n\n".join(f"[{m.get('role')}] {_text(m.get('content'))}" for m in rest)


def completion_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``completions.jsonl`` records as table rows (:data:`COLUMNS`)."""
    rows = []
    for record in records:
        prompt, completion = split_messages(record.get("messages") or [])
        answer = record.get("answer")
        rows.append(
            {
                "step": int(record["step"]),
                "group": int(record.get("group", 0)),
                "prompt": prompt,
                "completion": completion,
                "reward": float("nan") if record.get("reward") is None else float(record["reward"]),
                "answer": "" if answer is None else str(answer),
            }
        )
    return rows


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as ``{"a.b": "value"}`` strings (MLflow params)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out
