"""Held-out evaluation: run the policy on an env's eval split and report accuracy.

Evaluation goes through the same engine and rollout as training (eval mode, KV cache on), so an
in-process evaluation equals evaluating the saved run dir loaded fresh (docs/concepts/guards.md#evaluation).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from agentrl.env import CallGuard, Env
from agentrl.rewards.scoring import RewardFn, score
from agentrl.rewards.unscored import CAUSES, why_unscored
from agentrl.rundir.episodes import episode_record
from agentrl.rundir.metrics import env_metrics
from agentrl.sampling.engine import SamplingParams
from agentrl.sampling.rollout import Rollout
from agentrl.trajectory import Trajectory


def episode_success(trajectory: Trajectory, success_threshold: float = Env.success_threshold) -> bool:
    """Solved: the last step's ``info["success"]``, else ``info["correct"]``, else the env's return
    reaching ``success_threshold`` (the env's attribute; 1.0 by default)."""
    info = trajectory.info
    if "success" in info:
        return bool(info["success"])
    if "correct" in info:
        return bool(info["correct"])
    return trajectory.env_return >= success_threshold


def evaluate(
    rollout: Rollout,
    envs: list[Env],
    tasks: list[dict[str, Any]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    reward_fns: dict[str, tuple[RewardFn, float]] | None = None,
    batch_size: int = 64,
    guard: CallGuard | None = None,
    env_weight: float = 1.0,
    records: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, float], list[Trajectory]]:
    """Accuracy, mean env return, reward-function means and ``eval/reward_mean`` (the mean total
    reward, env return x ``env_weight`` + weighted reward functions: the training objective on
    held-out tasks) on ``tasks`` (one episode each), and how many episodes were scored
    (``eval/episodes_scored``, ``eval/episodes_unscored``, ``eval/unscored_<cause>``:
    :mod:`agentrl.rewards.unscored`; an unscored episode counts as unsolved in the accuracy);
    ``guard`` (the run's ``call_timeout_s`` / ``on_call_error``) runs the reward functions;
    ``records``, when given, receives each episode's line (:func:`agentrl.rundir.episodes.episode_record`,
    ``group``: its task's place in ``tasks``, no ``advantage``)."""
    trajectories: list[Trajectory] = []
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start : start + batch_size]
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + start)
        trajectories += rollout.run(envs[: len(chunk)], chunk, list(range(len(chunk))), sampling)
    metrics = {
        "eval/accuracy": float(np.mean([episode_success(t, envs[0].success_threshold) for t in trajectories])),
        "eval/env_return_mean": float(np.mean([t.env_return for t in trajectories])),
        "eval/turns_mean": float(np.mean([len(t.turns) for t in trajectories])),
        "eval/num_tasks": float(len(trajectories)),
        **env_metrics(trajectories, prefix="eval/env/"),
    }
    if any(env.tool_schemas() for env in envs):
        metrics["eval/tool_success_frac"] = float(np.mean([t.num_tool_calls_ok > 0 for t in trajectories]))
    errors: dict[str, int] = {}
    totals, components = score(trajectories, reward_fns or {}, env_weight=env_weight, guard=guard, errors=errors)
    metrics.update(why_unscored(trajectories, totals, errors).metrics("eval/"))
    if not np.isnan(totals).all():
        metrics["eval/reward_mean"] = float(np.nanmean(totals))
    for name, values in components.items():
        if name != "env" and not np.isnan(values).all():
            metrics[f"eval/{name}_mean"] = float(np.nanmean(values))
    if records is not None:
        for i, (trajectory, total) in enumerate(zip(trajectories, totals, strict=True)):
            scores = {name: float(values[i]) for name, values in components.items()}
            line = episode_record(
                trajectory, total=total, components=scores, unscored=unscored_cause(trajectory, total)
            )
            line.pop("advantage")
            records.append({**line, "group": i})
    return metrics, trajectories


def unscored_cause(trajectory: Trajectory, total: float) -> str | None:
    """Why ``trajectory`` (total reward ``total``) went unscored: one of
    :data:`agentrl.rewards.unscored.CAUSES`; None when it was scored."""
    if math.isfinite(total):
        return None
    found = why_unscored([trajectory], [total])
    return next((cause for cause in CAUSES if getattr(found, cause)), "no_reward")
