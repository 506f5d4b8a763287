"""Keep the policy that evaluated best, so the run's saved model is its best one, not its last.

Every held-out evaluation (before training, every ``eval_every`` steps, after the last step) is
offered to :class:`BestModel`; its score is ``eval/reward_mean`` by default (the run's own reward on
the held-out tasks: for math, correctness and the ``\\boxed{}`` format together), and a score at least as high as
the best so far (ties go to the later policy) saves that policy to ``<run_dir>/best/`` with ``best.json`` (step, score,
the evaluation's metrics). At the end the trainer exports the best policy as ``model/`` and, when it is not the
last one, the last policy as ``last/``.

The score is read from the same held-out split the run reports, so "best" is chosen on the
numbers it is then reported with: an optimistic pick when evaluations differ by noise (64 tasks:
one task is 0.016). The learning benchmarks (docs/benchmarks/learning.md) report the last step's policy as well.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.errors import one_line


class _BestInfo(BaseModel):
    """``best.json``: which step's policy ``best/`` holds and how it scored."""

    model_config = ConfigDict(strict=True, extra="allow")
    step: Annotated[int, Field(ge=0)]
    score: float
    metrics: dict[str, float | None]


BEST_DIR = "best"
BEST_FILE = "best.json"


class BestModel:
    """The best evaluation so far of a run and its saved policy (``run_dir/best``)."""

    def __init__(self, run_dir: Path, metric: str = "eval/reward_mean") -> None:
        self.folder, self.metric = run_dir / BEST_DIR, metric
        self.step: int | None = None
        self.score = float("-inf")
        self.metrics: dict[str, float] = {}

    def offer(self, step: int, metrics: dict[str, float], save: Callable[[Path], None]) -> bool:
        """Save the policy with ``save(folder)`` when its evaluation ``metrics`` score at least the
        best so far; returns whether it did. An evaluation without the metric changes nothing."""
        score = metrics.get(self.metric)
        if score is None or not score >= self.score:
            return False
        tmp = self.folder.with_name(f".tmp-{BEST_DIR}")
        _remove(tmp)
        save(tmp)
        (tmp / BEST_FILE).write_text(
            json.dumps({"step": step, "score": score, "metric": self.metric, "metrics": metrics}, indent=1)
        )
        _remove(self.folder)
        tmp.rename(self.folder)  # a kill leaves the old best or the new one, never half of one
        self.step, self.score, self.metrics = step, float(score), dict(metrics)
        return True

    def resume(self, completed_step: int) -> None:
        """Pick up the best saved before a resumed checkpoint; one saved after it (by steps the
        resumed run does again) is dropped."""
        _remove(self.folder.with_name(f".tmp-{BEST_DIR}"))
        info_path = self.folder / BEST_FILE
        if not info_path.is_file():
            return
        try:
            info = _BestInfo.model_validate_json(info_path.read_text())
        except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            print(f"note: {info_path} is unreadable ({one_line(exc)}): the best policy so far is forgotten", flush=True)
            _remove(self.folder)
            return
        if info.step > completed_step:
            _remove(self.folder)
            return
        self.step, self.score, self.metrics = info.step, info.score, info.metrics

    def summary(self) -> dict[str, Any]:
        """What ``eval.json`` records about the best policy."""
        return {"step": self.step, "metric": self.metric, "score": self.score, "metrics": self.metrics}


def _remove(folder: Path) -> None:
    """Delete ``folder``; a symbolic link there goes itself (what it points to is never written)."""
    if folder.is_symlink():
        folder.unlink()
    else:
        shutil.rmtree(folder, ignore_errors=True)
