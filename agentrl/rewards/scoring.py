"""Score trajectories: the env's own return plus weighted reward functions, NaN-aware.

Failures (a bad rollout is data, not a crash). Each reward function runs under the run's
:class:`agentrl.env.CallGuard`: at most ``call_timeout_s`` per call, then ``on_call_error``.

* A call that raises is retried one trajectory at a time, so only the samples it fails on are
  lost; a call that times out is not retried (that would cost a timeout per sample): the whole
  batch is lost for that function.
* ``skip``: a sample a reward function failed on, or whose env raised (``info["error"]``, set
  by the rollout; reward functions never see those episodes), gets a NaN total: it is unscored,
  its advantage is 0 and :func:`agentrl.trajectory.collate` takes it out of the loss. Failures
  are counted per function (``errors/reward/<name>`` in the trainer's metrics) and warned about
  once per function.
* ``fail``: a RewardError naming the function, the sample (index, task id and question) and
  the exception.
* Returning the wrong number of values or a non-number is a contract error and always fails, as
  is a weighted value beyond ±:data:`agentrl.env.MAX_ABS_REWARD` (from a reward function or the
  env's return): the error names the component, the value and the sample, instead of letting the
  float32 training math overflow.
* A SystemExit or KeyboardInterrupt raised in a reward function is its failure like any other
  exception (:mod:`agentrl.faults`); a real Ctrl-C still interrupts.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.env import MAX_ABS_REWARD, CallGuard, CallTimeout, sample_label
from agentrl.errors import AgentRLError, RewardError, one_line
from agentrl.rewards.process import StepRewards, merge_steps
from agentrl.trajectory import Trajectory


@dataclass(frozen=True)
class Scored:
    """A reward function's score of one episode with what it was based on: ``value`` is what a
    plain return gives (a float, :class:`StepRewards` or None), ``details`` JSON-able facts about
    how it was reached (a judge's ``prompt`` and ``reply``). Scoring keeps them in the episode's
    ``info["judgements"]``, one ``{"reward": name, **details, "score": component}`` per function
    that gave details (``score``: the component's value, None when unscored), which the episode
    store lifts into the episode's line (docs/concepts/run-dir.md)."""

    value: float | StepRewards | None
    details: Mapping[str, Any] = field(default_factory=dict)


RewardFn = Callable[..., list[float | StepRewards | Scored | None]]
Found = tuple[dict[int, StepRewards], dict[int, dict[str, Any]]]
"""What a reward function returned beside its values, by batch index: step rewards, details."""


def score(
    trajectories: list[Trajectory],
    reward_fns: dict[str, tuple[RewardFn, float]],
    env_weight: float,
    nonfinite: dict[str, int] | None = None,
    *,
    guard: CallGuard | None = None,
    errors: dict[str, int] | None = None,
) -> tuple[list[float], dict[str, np.ndarray]]:
    """Total reward per trajectory and each component's raw values (NaN = not scored).

    total = env_weight * env_return + sum(weight * reward) over the scored components; a
    trajectory no component scored gets NaN (its advantage is then 0, docs/concepts/guards.md#unscored-episodes). A
    value that is
    inf, -inf or NaN (from the env or a reward function) counts as not scored, with a warning: one
    infinite reward would otherwise make every advantage of the batch NaN. ``nonfinite``, when
    given, receives the number of such values per component, 0 included (``None`` from a reward
    function is an honest "not scored" and is not counted); the trainer logs the non-zero ones as
    ``reward/<name>_nonfinite``.

    ``guard`` (default: no time limit, ``fail``) runs the reward functions; ``errors``, when
    given, receives per function how many samples it failed on (module docstring). An episode
    whose env failed (``info["error"]``) or a function failed on gets a NaN total and NaN in
    every component.
    """
    guard = guard if guard is not None else CallGuard()
    scores = _components(trajectories, reward_fns, env_weight, guard, errors)
    _leave_unscored(scores, trajectories)
    if nonfinite is not None:
        nonfinite.update(scores.nonfinite)
    totals = _totals(scores, len(trajectories))
    if any(scores.steps.values()):
        _attach_steps(trajectories, scores.values, scores.weights, scores.steps, totals)
    _attach_judgements(trajectories, scores)
    return [float(x) for x in totals], scores.values


@dataclass
class _Scores:
    """Each component's raw values for one batch, as :func:`score` gathers them."""

    values: dict[str, np.ndarray]
    """Component name (``env`` first) -> its value per trajectory, (N,) (NaN: not scored)."""
    weights: dict[str, float]
    """Component name -> its weight (``env``: ``env_weight``)."""
    nonfinite: dict[str, int]
    """Component name -> how many of its values were inf, -inf or NaN."""
    failed: np.ndarray
    """(N,) the samples whose env failed or some reward function failed on."""
    steps: dict[str, dict[int, StepRewards]]
    """Reward function name -> batch index -> the step rewards it returned."""
    details: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    """Reward function name -> batch index -> the details it returned (:class:`Scored`)."""


def _components(
    trajectories: list[Trajectory],
    reward_fns: dict[str, tuple[RewardFn, float]],
    env_weight: float,
    guard: CallGuard,
    errors: dict[str, int] | None,
) -> _Scores:
    """The env's return and every reward function's values (run under ``guard`` on the episodes
    whose env did not fail); ``errors`` receives per function how many samples it failed on."""
    broken = np.array(["error" in t.info for t in trajectories], dtype=bool)  # (N,) env failed
    healthy = [t for t, bad in zip(trajectories, broken) if not bad]
    env = np.array([t.env_return for t in trajectories], dtype=np.float64)
    env[broken] = np.nan
    counts = {"env": int((~np.isfinite(env[~broken])).sum())}
    scores = _Scores({"env": env}, {"env": env_weight}, counts, failed=broken.copy(), steps={})
    for name, (fn, weight) in reward_fns.items():
        values = np.full(len(trajectories), np.nan)
        lost = np.zeros(len(trajectories), dtype=bool)
        scores.steps[name], scores.details[name] = {}, {}
        found = (scores.steps[name], scores.details[name])
        if healthy:
            values[~broken], lost[~broken], scores.nonfinite[name] = _call(
                name, fn, healthy, np.flatnonzero(~broken), guard, found
            )
        else:
            scores.nonfinite[name] = 0
        if errors is not None:
            errors[name] = int(lost.sum())
        scores.values[name], scores.weights[name] = values, weight
        scores.failed |= lost
    return scores


def _leave_unscored(scores: _Scores, trajectories: list[Trajectory]) -> None:
    """Non-finite values become NaN (warned about per component), a weighted value beyond
    ``MAX_ABS_REWARD`` raises, and every component of a failed sample becomes NaN."""
    for name, values in scores.values.items():
        values[~np.isfinite(values)] = np.nan
        _check_magnitude(name, values, scores.weights[name], trajectories)
        if scores.nonfinite[name]:
            warnings.warn(
                f"reward {name!r} gave {scores.nonfinite[name]} non-finite value(s) (inf or NaN); "
                "they count as not scored",
                RuntimeWarning,
                stacklevel=3,  # score's caller
            )
    for values in scores.values.values():
        values[scores.failed] = np.nan


def _totals(scores: _Scores, n: int) -> np.ndarray:
    """(N,) the weighted sum of each trajectory's scored components; NaN where none scored it."""
    # A component weighted 0 (e.g. env_reward_weight: 0) does not make an episode scored.
    stacked = np.stack(
        [values * scores.weights[name] for name, values in scores.values.items() if scores.weights[name] != 0]
        or [np.full(n, np.nan)]
    )  # (C, N)
    scored = ~np.isnan(stacked)
    return np.where(scored.any(axis=0), np.nansum(stacked, axis=0), np.nan)


def popped_metrics(reward_fns: dict[str, tuple[RewardFn, float]]) -> dict[str, float]:
    """What the reward functions that count things report (``pop_metrics()``, e.g. a judge's parse
    failures since the last call), as ``<label>/<key>``."""
    out: dict[str, float] = {}
    for label, (fn, _) in reward_fns.items():
        pop = getattr(fn, "pop_metrics", None)
        if callable(pop):
            out.update({f"{label}/{key}": float(value) for key, value in pop().items()})
    return out


def _attach_steps(
    trajectories: list[Trajectory],
    components: dict[str, np.ndarray],
    weights: dict[str, float],
    steps: dict[str, dict[int, StepRewards]],
    totals: np.ndarray,
) -> None:
    """Each scored trajectory's weighted step rewards (:func:`agentrl.rewards.process.merge_steps`)."""
    for i, trajectory in enumerate(trajectories):
        parts = [
            (name, steps.get(name, {}).get(i, float(values[i])), weights[name])
            for name, values in components.items()
            if weights[name] != 0 and not np.isnan(values[i])
        ]
        trajectory.step_rewards = None if np.isnan(totals[i]) else merge_steps(trajectory, parts)


def _attach_judgements(trajectories: list[Trajectory], scores: _Scores) -> None:
    """Each trajectory's ``info["judgements"]``: per reward function that returned details for it
    (:class:`Scored`), ``{"reward": name, **details, "score": its component value or None}``."""
    for i, trajectory in enumerate(trajectories):
        out = []
        for name, found in scores.details.items():
            if i in found:
                value = float(scores.values[name][i])
                kept = {k: v for k, v in found[i].items() if k not in ("reward", "score")}
                out.append({"reward": name, **kept, "score": None if math.isnan(value) else value})
        if out:
            trajectory.info["judgements"] = out


def _check_magnitude(name: str, values: np.ndarray, weight: float, trajectories: list[Trajectory]) -> None:
    """RewardError for the first value whose weighted size passes ``MAX_ABS_REWARD`` (NaN: not scored)."""
    with np.errstate(over="ignore", invalid="ignore"):
        weighted = np.abs(values * weight)  # (N,)
    beyond = np.flatnonzero(weighted > MAX_ABS_REWARD)
    if not len(beyond):
        return
    i = int(beyond[0])
    what = "the env returned" if name == "env" else f"reward function {name!r} returned"
    scaled = "" if weight == 1 else f" (x {'env_reward_weight' if name == 'env' else 'weight'} {weight:g})"
    raise RewardError(
        f"{what} {values[i]:g}{scaled} for {sample_label(i, trajectories[i].task)}: weighted "
        f"rewards must be within ±{MAX_ABS_REWARD:g} (training runs in float32; larger values "
        f"overflow the reward statistics and the loss): rescale it"
    )


def _call(
    name: str,
    fn: RewardFn,
    trajectories: list[Trajectory],
    indices: np.ndarray,
    guard: CallGuard,
    found: Found,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``fn``'s values as floats (None -> NaN), which samples it failed on ``(n,)``, and how many
    values were inf, -inf or NaN. ``indices``: the trajectories' positions in the batch;
    ``found`` receives the :class:`StepRewards` and the details it returned by position."""
    try:
        raw = guard.call(fn, trajectories=trajectories)
    except AgentRLError:
        raise
    except Exception as exc:
        return _isolate(name, fn, trajectories, indices, guard, exc, found)
    values, nonfinite = _parse(name, raw, indices, found)
    return values, np.zeros(len(trajectories), dtype=bool), nonfinite


def _isolate(
    name: str,
    fn: RewardFn,
    trajectories: list[Trajectory],
    indices: np.ndarray,
    guard: CallGuard,
    exc: Exception,
    found: Found,
) -> tuple[np.ndarray, np.ndarray, int]:
    """After a batch call failed with ``exc``: retry one trajectory at a time (not after a timeout),
    then raise (``fail``) or warn once and mark the failed samples (``skip``)."""
    n = len(trajectories)
    values, lost, nonfinite = np.full(n, np.nan), np.zeros(n, dtype=bool), 0
    first: tuple[int | None, Exception] | None = None
    if isinstance(exc, CallTimeout):
        lost[:], first = True, (None, exc)
    for i, trajectory in enumerate(trajectories if first is None else []):
        try:
            raw = guard.call(fn, trajectories=[trajectory])
        except AgentRLError:
            raise
        except Exception as single:
            first = first or (i, single)
            if not guard.skips:
                break
            if isinstance(single, CallTimeout):  # stop retrying: each retry could cost a timeout
                lost[i:] = True
                break
            lost[i] = True
            continue
        one, bad = _parse(name, raw, indices[i : i + 1], found)
        values[i], nonfinite = one[0], nonfinite + bad
    if first is None:  # every sample scored alone: the failure needs the whole batch
        values[:], lost[:], nonfinite, first = np.nan, True, 0, (None, exc)
    index, error = first
    verb = "timed out" if isinstance(error, CallTimeout) else "raised"
    where = (
        f"{sample_label(int(indices[index]), trajectories[index].task)}"
        if index is not None
        else f"the batch of {n} samples ({sample_label(int(indices[0]), trajectories[0].task)} first)"
    )
    what = f"reward function {name!r} {verb} on {where}: {one_line(error)}"
    if not guard.skips:
        raise RewardError(
            f"{what} (on_call_error=fail; with 'skip' the sample would be left unscored and "
            f"counted in errors/reward/{name})"
        ) from error
    guard.warn_once(
        f"reward:{name}",
        f"{what}; the samples it fails on are left unscored (on_call_error=skip) "
        f"and counted in errors/reward/{name}; later failures are not warned about",
    )
    return values, lost, nonfinite


def _parse(name: str, values: Any, indices: np.ndarray, found: Found) -> tuple[np.ndarray, int]:
    """A reward function's output for the samples at ``indices`` as floats (None -> NaN; a
    :class:`StepRewards`: the sum of its values, NaN without steps, kept in ``found[0]``; a
    :class:`Scored`: its value, its details kept in ``found[1]``) and how many were inf, -inf or
    NaN; RewardError for the wrong count or a non-number."""
    steps, details = found
    n = len(indices)
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise RewardError(
            f"reward function {name!r} must return one float, StepRewards, Scored or None per trajectory ({n}), "
            f"got {got}"
        )
    out = np.empty(n, dtype=np.float64)
    nonfinite = 0
    for i, value in enumerate(values):
        if isinstance(value, Scored):
            details[int(indices[i])] = dict(value.details)
            value = value.value
        if value is None:
            out[i] = math.nan
        elif isinstance(value, StepRewards):
            out[i], steps[int(indices[i])] = value.total, value
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[i] = float(value)
            nonfinite += not math.isfinite(out[i])
        else:
            raise RewardError(
                f"reward function {name!r} returned {value!r} for sample {int(indices[i])}: "
                "expected float, StepRewards, Scored or None"
            )
    return out, nonfinite
