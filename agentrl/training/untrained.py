"""Steps that trained nothing, and the errors that stop a run which cannot train.

A step trains nothing when no episode of its batch was scored (the update is skipped: only Adam
momentum would move the weights) or when every optimizer step of it had a non-finite loss or
gradient. :class:`UntrainedSteps` keeps them: ``max_nonfinite_steps`` of them in a row stop the run
(:meth:`UntrainedSteps.stuck_error`), and a run none of whose steps trained fails at its end
(:meth:`UntrainedSteps.untrained_error`) instead of reporting an untrained policy as its result
(docs/concepts/guards.md#runs-that-train-nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import TrainingError
from agentrl.rewards.unscored import Unscored


@dataclass
class Skip:
    """One step that trained nothing."""

    step: int
    unscored: Unscored | None
    """Why no episode of it was scored; None: its loss or gradients were not finite."""


class UntrainedSteps:
    """The steps of this process's run that trained nothing: the ones in a row, and all of them."""

    def __init__(self) -> None:
        self.streak: list[Skip] = []
        """The steps in a row that trained nothing, up to the last step (this session's)."""
        self.skips: list[Skip] = []
        """Every step of this session that trained nothing."""
        self.steps = 0
        """Steps run in this session."""

    @property
    def trained(self) -> int:
        """Steps of this session that trained."""
        return self.steps - len(self.skips)

    def record(self, step: int, trained: bool, unscored: Unscored | None = None) -> None:
        """Step ``step`` trained, or not (``unscored``: why none of its episodes was scored; None
        with ``trained`` False: a non-finite loss or gradient)."""
        self.steps += 1
        if trained:
            self.streak = []
            return
        skip = Skip(step, unscored)
        self.streak.append(skip)
        self.skips.append(skip)

    def stuck_error(self, step: int, in_a_row: int, limit: int, run_dir: Path) -> TrainingError:
        """The error that stops a run after ``step`` whose last ``in_a_row`` steps trained nothing."""
        known = self.streak[-in_a_row:]
        why = f": {describe(known)}" if known else ""
        return TrainingError(
            f"steps {step - in_a_row + 1}-{step}: {in_a_row} steps in a row trained nothing "
            f"(max_nonfinite_steps={limit}){why}; stopping. The weights are those after step {step - in_a_row}; "
            f"{run_dir}/metrics.jsonl shows the steps (train/episodes_unscored, train/grad_norm, loss/total, "
            f"reward/*). {_advice(known)}"
        )

    def untrained_error(self, first_step: int, run_dir: Path, saved: str) -> TrainingError | None:
        """The error of a run (or of the steps since its resume, from ``first_step``) none of whose
        steps trained; None when one did. ``saved``: what the run dir holds, in words."""
        if not self.steps or self.trained:
            return None
        what = "the run" if first_step == 1 else f"steps {first_step}-{first_step + self.steps - 1} since the resume"
        return TrainingError(
            f"{what} trained nothing: {describe(self.skips, of=self.steps)}. {_advice(self.skips)}; "
            f"{saved} in {run_dir}"
        )


def describe(skips: list[Skip], of: int | None = None) -> str:
    """Why ``skips`` trained nothing: ``2 of 2 steps had no scored episode (16 episodes: 16 raised;
    first: ...)``, ``1 of 2 steps had ..., 1 had a non-finite loss or gradient`` (``of``: the steps they are among)."""
    unscored = [s.unscored for s in skips if s.unscored is not None]
    nonfinite = len(skips) - len(unscored)
    among = f" of {of} steps" if of is not None else ""
    parts = []
    if unscored:
        total = Unscored()
        for why in unscored:
            total.add(why)
        detail = f" ({total.describe()})" if total.unscored else ""
        parts.append(f"{len(unscored)}{among} had no scored episode{detail}")
        among = ""
    if nonfinite:
        parts.append(f"{nonfinite}{among} had a non-finite loss or gradient")
    return ", ".join(parts)


def _advice(skips: list[Skip]) -> str:
    """What to look at first, for these skipped steps."""
    if skips and all(s.unscored is not None for s in skips):
        return "Fix the cause and train again (on_call_error=fail stops a run at its first failing call)"
    return "Lower learning_rate or check the rewards"
