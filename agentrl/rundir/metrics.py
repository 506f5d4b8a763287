"""Metric bookkeeping: per-step JSONL and TensorBoard, plus rollout statistics."""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.errors import EnvError, TrainingError
from agentrl.rundir.links import open_nofollow
from agentrl.trajectory import Trajectory


class MetricsWriter:
    """Appends one JSON line per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, purge_step: int | None = None) -> None:
        """``purge_step``: a resumed run's first step; TensorBoard hides events from it onwards
        that an earlier, killed process wrote after its last checkpoint."""
        self.path = run_dir / "metrics.jsonl"
        self._tb: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge_step)
        except ImportError:  # tensorboard is a dependency; tolerate a stripped install
            self._tb = None

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` for ``step``; a TrainingError naming the file when it cannot be written."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        line = json.dumps({"step": step, **clean}) + "\n"
        size = self.path.stat().st_size if self.path.is_file() else 0
        try:
            with open_nofollow(self.path, "a") as f:  # one write of a whole line, flushed to disk before the next step
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.truncate(self.path, size)  # no torn line left behind (a resume would drop it anyway)
            cause = (exc.strerror or str(exc)).lower()
            raise TrainingError(
                f"could not write step {step} to {self.path}: {cause}; the steps before it are there "
                f"and in the newest checkpoint: fix that, then `agentrl train --resume "
                f"{self.path.parent}`"
            ) from None
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self._tb is not None:
            self._tb.close()


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL log such as ``metrics.jsonl`` ([] when it does not exist); a
    TrainingError naming the file and line of one that is not a JSON object."""
    rows = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines() if path.is_file() else [], 1):
        try:
            row = json.loads(line) if line.strip() else {}
        except ValueError:
            row = None
        if not isinstance(row, dict):
            raise TrainingError(f"{path}, line {number}: not a JSON object ({line[:60]!r}); fix or delete that line")
        if row:
            rows.append(row)
    return rows


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Lengths, turns, tool use and truncation over a batch of trajectories (turns and tool calls
    over every segment of an episode); ``errors/env``: how many episodes an env failure ended
    (``info["error"]``, set by the rollout)."""
    sampled = np.array([t.num_sampled_tokens for t in trajectories], dtype=np.float64)
    rows = [[*t.segments, t] for t in trajectories]
    turns = np.array([sum(len(r.turns) for r in episode) for episode in rows], dtype=np.float64)
    calls = np.array([sum(r.num_tool_calls for r in episode) for episode in rows], dtype=np.float64)
    ran = np.array([sum(r.num_tool_calls_ok for r in episode) for episode in rows], dtype=np.float64)
    errors = calls - ran
    stopped = [t.turns[-1].finish_reason == "stop" for t in trajectories if t.turns]
    return {
        "rollout/sampled_tokens_mean": float(sampled.mean()),
        "rollout/sampled_tokens_min": float(sampled.min()),
        "rollout/sampled_tokens_max": float(sampled.max()),
        "rollout/sequence_length_mean": float(np.mean([len(t.token_ids) for t in trajectories])),
        "rollout/turns_mean": float(turns.mean()),
        "rollout/tool_calls_mean": float(calls.mean()),
        "rollout/tool_error_rate": float(errors.sum() / calls.sum()) if calls.sum() else 0.0,
        "rollout/tool_success_frac": float(np.mean(ran > 0)),
        "rollout/truncated_frac": float(np.mean([t.truncated for t in trajectories])),
        "rollout/stopped_frac": float(np.mean(stopped)) if stopped else 0.0,
        "rollout/prompt_too_long_frac": float(np.mean([bool(t.info.get("prompt_too_long")) for t in trajectories])),
        "errors/env": float(sum("error" in t.info for t in trajectories)),
        **env_metrics(trajectories, prefix="env/"),
    }


def env_metrics(trajectories: list[Trajectory], prefix: str) -> dict[str, float]:
    """Means of the envs' own figures (``info["metrics"]`` at each episode's last step), over
    the episodes that report each one; a non-numeric value is an EnvError naming it."""
    values: dict[str, list[float]] = {}
    for trajectory in trajectories:
        reported = trajectory.info.get("metrics") or {}
        if not isinstance(reported, dict):
            raise EnvError(f'info["metrics"] must be a dict of name -> number, got {reported!r}')
        for name, value in reported.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise EnvError(f'info["metrics"][{name!r}] must be a number, got {value!r}')
            values.setdefault(str(name), []).append(float(value))
    return {prefix + name: float(np.mean(v)) for name, v in sorted(values.items())}


def reward_metrics(totals: list[float], components: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean/std of the total reward and of each component (NaN-aware), and
    ``reward/scored_frac``: the share of episodes with a total (0.0: nothing to learn from)."""
    scored = np.isfinite(np.array(totals, dtype=np.float64))
    out: dict[str, float] = {"reward/scored_frac": float(scored.mean()) if len(scored) else 0.0}
    for name, values in [("total", np.array(totals, dtype=np.float64)), *components.items()]:
        if np.isnan(values).all():
            out[f"reward/{name}_mean"] = math.nan
            continue
        out[f"reward/{name}_mean"] = float(np.nanmean(values))
        out[f"reward/{name}_std"] = float(np.nanstd(values))
    return out


class NoWriter:
    """The metrics writer of a process other than the main one: writes nothing."""

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Nothing."""
        return None

    def close(self) -> None:
        """Nothing."""
        return None
