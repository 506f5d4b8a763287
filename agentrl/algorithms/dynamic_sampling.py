"""DAPO dynamic sampling (arXiv 2503.14476): train only on groups whose rewards differ.

A group whose scored rewards are all equal (every episode solved, or none) has zero
group-relative advantage: it adds no gradient, only tokens to the loss denominators, and late in
a run most groups are like that. With ``dynamic_sampling`` on, the trainer rolls out more tasks
(up to ``max_sampling_rounds`` rounds per step) until it has ``prompts_per_step`` groups with a
spread; if the rounds run out first the batch is filled with the zero-spread groups sampled
first, so a step always trains on exactly ``prompts_per_step`` whole groups of ``num_generations``
episodes and every algorithm, loss denominator and metric sees the usual batch shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agentrl.trajectory import Trajectory


def has_spread(totals: Sequence[float]) -> bool:
    """Whether a group's scored (finite) rewards differ: at least two of them, not all equal."""
    scored = [x for x in totals if math.isfinite(x)]
    return len(scored) >= 2 and max(scored) > min(scored)


@dataclass
class _Group:
    trajectories: list[Trajectory]
    totals: list[float]
    components: dict[str, np.ndarray]


@dataclass
class GroupSelector:
    """Collects the groups a step trains on over its sampling rounds.

    ``wanted`` groups of ``group_size`` episodes; with ``filter_groups`` off every group is kept
    as sampled (one round is enough). Groups are taken in the order they were sampled.
    """

    wanted: int
    group_size: int
    filter_groups: bool = True
    kept: list[_Group] = field(default_factory=list)
    spares: list[_Group] = field(default_factory=list)
    sampled_groups: int = 0

    @property
    def missing(self) -> int:
        """Groups still wanted."""
        return max(self.wanted - len(self.kept), 0)

    def add(self, trajectories: list[Trajectory], totals: list[float], components: dict[str, np.ndarray]) -> None:
        """One round's episodes: whole groups of ``group_size``, in group order."""
        if len(trajectories) % self.group_size or len(totals) != len(trajectories):
            raise ValueError(
                f"{len(trajectories)} episodes and {len(totals)} rewards are not whole groups of {self.group_size}"
            )
        for start in range(0, len(trajectories), self.group_size):
            rows = slice(start, start + self.group_size)
            group = _Group(trajectories[rows], list(totals[rows]), {k: v[rows] for k, v in components.items()})
            self.sampled_groups += 1
            if not self.filter_groups or has_spread(group.totals):
                if len(self.kept) < self.wanted:
                    self.kept.append(group)
            else:
                self.spares.append(group)

    @property
    def filled(self) -> int:
        """Zero-spread groups :meth:`batch` adds because the rounds ran out."""
        return min(self.missing, len(self.spares))

    def batch(self, first_group: int) -> tuple[list[Trajectory], list[float], dict[str, np.ndarray]]:
        """The ``wanted`` groups (kept ones, then spares), renumbered ``first_group``, ``first_group + 1``,
        ...: trajectories, totals and reward components, in group order."""
        groups = self.kept + self.spares[: self.missing]
        if len(groups) < self.wanted:
            raise ValueError(f"{len(groups)} groups sampled, {self.wanted} wanted")
        trajectories: list[Trajectory] = []
        for index, group in enumerate(groups):
            for trajectory in group.trajectories:
                trajectory.group = first_group + index
                trajectories.append(trajectory)
        totals = [x for group in groups for x in group.totals]
        names = groups[0].components if groups else {}
        components = {name: np.concatenate([g.components[name] for g in groups]) for name in names}
        return trajectories, totals, components
