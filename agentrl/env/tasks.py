"""``LazyTasks``: a fixed-length, indexable task source whose items are made on demand; a task's
identity and a split's first tasks, for the env checks (:mod:`agentrl.testing`)."""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from typing import Any, overload

Task = dict[str, Any]


class LazyTasks(Sequence[Task], abc.ABC):
    """``tasks[i]`` is ``make(i)``: procedural splits of any length without materialising them.

    Subclasses implement ``make``; indexing, negative indices, slices and bounds are handled here.
    """

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, index: int) -> Task: ...
    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...
    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.length))]
        if not -self.length <= index < self.length:
            raise IndexError(f"task index {index} out of range for {self.length} tasks")
        return self.make(int(index) % self.length)

    @abc.abstractmethod
    def make(self, index: int) -> Task:
        """The task at ``index`` (0 <= index < length), deterministically."""


def first_tasks(tasks: Sequence[Task], n: int) -> list[Task]:
    """The first ``n`` tasks of ``tasks`` (all of them when there are fewer)."""
    return [tasks[i] for i in range(min(n, len(tasks)))]


def task_key(task: Task) -> str:
    """A task's identity for disjointness: its ``id`` if it has one, else its question."""
    if "id" in task:
        return f"id:{task['id']}"
    if isinstance(task.get("question"), str):
        return task["question"]
    return json.dumps(task, sort_keys=True, default=repr)
