"""Writes the run's episode store (:mod:`agentrl.rundir.episodes`): each step's episodes with
their advantages, each evaluation's episodes, and cuts both files back on ``--resume``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.model import distributed
from agentrl.rundir import episodes
from agentrl.rundir.directory import truncate
from agentrl.training.build import Run
from agentrl.trajectory import TrainBatch

LOGS = ("metrics", "completions", "eval_completions")
"""The append-only files a checkpoint records the size of (``<name>_bytes``)."""


class EpisodeLog:
    """The episode store of one run (``run_dir``); only the main process writes."""

    def __init__(self, run: Run, run_dir: Path) -> None:
        self.run, self.run_dir = run, run_dir
        self.advantages: dict[int, list[float | None]] = {}
        """Step -> the whole batch's per-row advantages, from its update until its line is written."""
        self.token_values: dict[int, list[Any]] = {}
        """Step -> the whole batch's per-row trainer logprobs and entropies (``log_tokens: logprobs``)."""

    def due(self, step: int) -> bool:
        """Whether step ``step``'s episodes are written (``log_completions_every``)."""
        return episodes.due(self.run.config.log_completions_every, step)

    def updated(self, step: int, batch: TrainBatch) -> None:
        """After step ``step``'s update (every process: a collective): keep its rows' advantages."""
        if self.due(step):
            shares = distributed.gather_objects(episodes.row_advantages(batch))
            self.advantages[step] = [value for share in shares for value in share]
            if "trainer_logprobs" in batch.extras:
                shares = distributed.gather_objects(episodes.row_token_values(batch))
                self.token_values[step] = [value for share in shares for value in share]

    def write_step(self, step: int, records: list[dict[str, Any]]) -> None:
        """Append step ``step``'s episode lines (when due) with their advantages (main process)."""
        rows, values = self.advantages.pop(step, []), self.token_values.pop(step, None)
        if self.due(step) and self.run.is_main:
            if values is not None:
                episodes.with_trainer_values(records, values)
            episodes.append(self.run_dir / episodes.TRAIN_FILE, {"step": step}, episodes.with_advantages(records, rows))

    def write_eval(self, step: int, final: bool, records: list[dict[str, Any]]) -> None:
        """Append an evaluation's episode lines after ``step`` (``final``: the run's last one)."""
        if self.run.is_main and records:
            head = {"when": episodes.eval_label(step, final), "step": step}
            episodes.append(self.run_dir / episodes.EVAL_FILE, head, records)

    def cut_back(self, resumed: dict[str, Any]) -> None:
        """Cut each log back to its size at the checkpoint ``resumed`` (lines written after it, or
        one torn by a kill); a log the checkpoint does not record (an older one) stays."""
        for log in LOGS:
            size = resumed.get(f"{log}_bytes")
            if size is not None and (lost := truncate(self.run_dir / f"{log}.jsonl", size)):
                print(f"note: {lost}", flush=True)
