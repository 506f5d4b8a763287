"""Why episodes went unscored: counts by cause and the first failure, from any rollout's trajectories.

An episode is *scored* when its total reward (:func:`agentrl.rewards.scoring.score`) is finite.
One that is not ended in one of four ways, told apart from what every rollout records generically:

* **raised**: its agent or env code raised (``info["error"]``, set by the rollout: a dict with
  ``method``, ``exception`` and ``timed_out``, or any other value an env reports as its error);
* **timed out**: the same, ``info["error"]["timed_out"]`` true;
* **non-finite return**: its env (or an agent that returns its reward) gave NaN or ±inf;
* **no reward**: no reward function scored it (each returned None or a non-finite value for it, or
  failed on it; ``errors`` and ``nonfinite`` of :func:`agentrl.rewards.scoring.score` say which).

:func:`why_unscored` summarises a batch; :class:`Unscored` adds up steps, turns itself into metrics
(``<prefix>episodes_scored``, ``<prefix>episodes_unscored``, ``<prefix>unscored_<cause>``) and back,
and says it all on one line (:meth:`Unscored.describe`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.env import sample_label
from agentrl.trajectory import Trajectory

CAUSES = ("raised", "timed_out", "nonfinite_return", "no_reward")
"""The causes an unscored episode is counted under, as :class:`Unscored` names its fields."""
_WORDS = {
    "raised": "raised",
    "timed_out": "timed out",
    "nonfinite_return": "returned a non-finite reward",
    "no_reward": "got no finite reward from any reward function",
}


@dataclass
class Unscored:
    """How many episodes were sampled and scored, why the others were not, and the first failure."""

    episodes: int = 0
    scored: int = 0
    raised: int = 0
    timed_out: int = 0
    nonfinite_return: int = 0
    no_reward: int = 0
    first: str = ""
    """The first unscored episode's failure in words ("" when none was seen)."""
    reward_notes: dict[str, int] = field(default_factory=dict)
    """Per reward function, the samples it failed on or gave a non-finite value (``'name failed'``)."""
    returns: dict[str, int] = field(default_factory=dict)
    """The non-finite returns seen (``'nan'``, ``'inf'``, ``'-inf'``) and how many of each."""

    @property
    def unscored(self) -> int:
        """Episodes with no finite total reward."""
        return self.episodes - self.scored

    def add(self, other: Unscored) -> Unscored:
        """Add ``other``'s counts to these (its first failure when none is known yet); returns self."""
        for name in ("episodes", "scored", *CAUSES):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.first = self.first or other.first
        for mine, theirs in ((self.reward_notes, other.reward_notes), (self.returns, other.returns)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        return self

    def metrics(self, prefix: str) -> dict[str, float]:
        """The counts as metrics: ``<prefix>episodes_scored``, ``<prefix>episodes_unscored`` and
        ``<prefix>unscored_<cause>`` for each cause that occurred."""
        out = {f"{prefix}episodes_scored": float(self.scored), f"{prefix}episodes_unscored": float(self.unscored)}
        out.update(
            {f"{prefix}unscored_{cause}": float(getattr(self, cause)) for cause in CAUSES if getattr(self, cause)}
        )
        return out

    @classmethod
    def from_metrics(cls, rows: Iterable[Mapping[str, Any]], prefix: str) -> Unscored:
        """The counts :meth:`metrics` wrote, added over ``rows`` (metric rows; those without them
        add nothing)."""
        total = cls()
        for row in rows:
            if f"{prefix}episodes_scored" not in row:
                continue
            scored, unscored = int(row[f"{prefix}episodes_scored"]), int(row[f"{prefix}episodes_unscored"])
            causes = {cause: int(row.get(f"{prefix}unscored_{cause}", 0)) for cause in CAUSES}
            total.add(cls(episodes=scored + unscored, scored=scored, **causes))
        return total

    def causes(self) -> str:
        """The unscored episodes by cause: ``16 raised, 2 timed out`` ("" when all were scored)."""
        parts = []
        for cause in (c for c in CAUSES if getattr(self, c)):
            parts.append(f"{getattr(self, cause)} {_WORDS[cause]}")
            if cause == "nonfinite_return" and self.returns:
                parts[-1] += f" ({', '.join(f'{n} {value}' for value, n in sorted(self.returns.items()))})"
            if cause == "no_reward" and self.reward_notes:
                parts[-1] += f" ({', '.join(f'{note} on {n}' for note, n in sorted(self.reward_notes.items()))})"
        return ", ".join(parts)

    def describe(self) -> str:
        """``16 episodes: 16 raised; first: agent raised on sample 3 (task ...): KeyError: 'x'``."""
        if not self.unscored:
            return f"{self.episodes} episodes, all scored"
        first = f"; first: {self.first}" if self.first else ""
        return f"{self.episodes} episodes: {self.causes()}{first}"


def why_unscored(
    trajectories: list[Trajectory],
    totals: list[float],
    errors: Mapping[str, int] | None = None,
    nonfinite: Mapping[str, int] | None = None,
) -> Unscored:
    """Why the episodes among ``trajectories`` whose total in ``totals`` (as :func:`agentrl.rewards.scoring.score`
    returned them) is not finite went unscored; ``errors`` / ``nonfinite``: that call's per-function
    counts of failed samples and non-finite values, named in the ``no_reward`` cause."""
    out = Unscored(episodes=len(trajectories))
    for index, (trajectory, total) in enumerate(zip(trajectories, totals)):
        if math.isfinite(total):
            out.scored += 1
            continue
        cause, words = _cause(index, trajectory)
        setattr(out, cause, getattr(out, cause) + 1)
        if cause == "nonfinite_return":
            out.returns[str(trajectory.env_return)] = out.returns.get(str(trajectory.env_return), 0) + 1
        out.first = out.first or words
    for notes, what in ((errors, "failed"), (nonfinite, "non-finite")):
        for name, n in (notes or {}).items():
            if n and name != "env":
                out.reward_notes[f"{name} {what}"] = n
    return out


def _cause(index: int, trajectory: Trajectory) -> tuple[str, str]:
    """(cause, the failure in words) of one unscored episode, sample ``index`` of its batch."""
    label = sample_label(index, trajectory.task)
    error = trajectory.info.get("error")
    if isinstance(error, Mapping):
        timed_out = bool(error.get("timed_out"))
        where = error.get("method") or "the episode"
        detail = error.get("exception")
        what = f"{where} {'timed out' if timed_out else 'raised'} on {label}{f': {detail}' if detail else ''}"
        return ("timed_out" if timed_out else "raised"), what
    if error is not None:
        return "raised", f"{label} ended with an error: {str(error)[:200]}"
    env_return = trajectory.env_return
    if not math.isfinite(env_return):
        return "nonfinite_return", f"{label} returned reward {env_return}"
    return "no_reward", f"no reward function gave {label} a finite reward"
