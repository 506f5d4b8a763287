"""Score trajectories: the env's own return plus weighted reward functions, NaN-aware."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from agentrl.errors import RewardError
from agentrl.trajectory import Trajectory

RewardFn = Callable[..., list[float | None]]


def score(trajectories: list[Trajectory], reward_fns: dict[str, tuple[RewardFn, float]],
          env_weight: float, nonfinite: dict[str, int] | None = None) -> tuple[list[float], dict[str, np.ndarray]]:
    """Total reward per trajectory and each component's raw values (NaN = not scored).

    total = env_weight * env_return + sum(weight * reward) over the scored components; a
    trajectory no component scored gets NaN (its advantage is then 0, TRAPS 17). A value that is
    inf, -inf or NaN (from the env or a reward function) counts as not scored, with a warning: one
    infinite reward would otherwise make every advantage of the batch NaN. ``nonfinite``, when
    given, receives the number of such values per component, 0 included (``None`` from a reward
    function is an honest "not scored" and is not counted); the trainer logs the non-zero ones as
    ``reward/<name>_nonfinite``.
    """
    env = np.array([t.env_return for t in trajectories], dtype=np.float64)
    components: dict[str, np.ndarray] = {"env": env}
    counts = {"env": int((~np.isfinite(env)).sum())}
    weights = {"env": env_weight}
    for name, (fn, weight) in reward_fns.items():
        components[name], counts[name] = _call(name, fn, trajectories)
        weights[name] = weight
    for name, values in components.items():
        values[~np.isfinite(values)] = np.nan
        if counts[name]:
            warnings.warn(f"reward {name!r} gave {counts[name]} non-finite value(s) (inf or NaN); they count "
                          "as not scored", RuntimeWarning, stacklevel=2)
    if nonfinite is not None:
        nonfinite.update(counts)
    stacked = np.stack([components[n] * weights[n] for n in components])  # (C, N)
    scored = ~np.isnan(stacked)
    totals = np.where(scored.any(axis=0), np.nansum(stacked, axis=0), np.nan)
    return [float(x) for x in totals], components


def _call(name: str, fn: RewardFn, trajectories: list[Trajectory]) -> tuple[np.ndarray, int]:
    """``fn``'s values as floats (None -> NaN) and how many it gave as inf, -inf or NaN."""
    try:
        values: Any = fn(trajectories=trajectories)
    except Exception as exc:
        raise RewardError(f"reward function {name!r} raised: {exc!r}") from exc
    if not isinstance(values, (list, tuple)) or len(values) != len(trajectories):
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise RewardError(
            f"reward function {name!r} must return one float or None per trajectory "
            f"({len(trajectories)}), got {got}"
        )
    out = np.empty(len(values), dtype=np.float64)
    nonfinite = 0
    for i, value in enumerate(values):
        if value is None:
            out[i] = math.nan
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[i] = float(value)
            nonfinite += not math.isfinite(out[i])
        else:
            raise RewardError(f"reward function {name!r} returned {value!r} for sample {i}: expected float or None")
    return out, nonfinite
