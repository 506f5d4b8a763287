"""Short labels of tasks and batch samples for error messages."""

from __future__ import annotations

from typing import Any

from agentrl.env.checks import describe, short_repr


def task_label(task: Any) -> str:
    """``task 'id-7': 'What is 2 + 2?'`` (its id and question or prompt, cut short) for messages."""
    if not isinstance(task, dict):
        return f"task {describe(task)}"
    parts = [repr(task["id"])] if "id" in task else []
    text = task.get("question", task.get("prompt"))
    if text is not None:
        parts.append(short_repr(text if isinstance(text, str) else str(text)))
    return f"task {': '.join(parts)}" if parts else f"task {short_repr(task)}"


def sample_label(index: int, task: Any) -> str:
    """``sample 3 (task 'id-7': 'What is 2 + 2?')``: a batch sample for error messages."""
    return f"sample {index} ({task_label(task)})"
