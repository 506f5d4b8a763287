"""Process supervision: step-level rewards and DeepSeekMath's process-supervised group advantage.

A reward function may return, for an episode, a :class:`StepRewards` instead of one number: a
reward at the end of each step, the step's end being a token index into ``Trajectory.token_ids``
(a token the model sampled). Build one from the turns (:meth:`StepRewards.per_turn`) or from a
text separator (:func:`step_ends`, then :meth:`StepRewards.at`).

How step and outcome rewards mix (:func:`merge_steps`): an episode's step rewards are, per
position, the weighted sum over every component of the rewards it put there, where a plain number
(an outcome reward, the env's return included) is a step reward at the episode's last sampled
token. So the scalar total of :func:`agentrl.rewards.scoring.score` is always the sum of the episode's step
rewards; a component's own scalar (``reward/<name>_mean``) is the sum of its step values, and an
empty :class:`StepRewards` (no step) is "not scored" for that component, like None.

Process-supervised advantage (DeepSeekMath, arXiv 2402.03300, section 4.1.3), per group of
episodes of one task, over the group's step rewards pooled (every step of every scored episode):

    r~ = (r - mean(R_group)) / max(std(R_group), eps)        A_t = sum of r~ over the steps ending at or after t

on the loss-mask tokens (0 elsewhere). A group whose pooled step rewards are all equal (or that has
fewer than two) gets 0 everywhere, as the outcome advantage does; an episode with no step gets 0.
With one step per episode at its last sampled token this is the outcome advantage.
Shape letters: N episodes, T tokens, K groups. Computed in float64.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.errors import RewardError
from agentrl.trajectory import Trajectory

if TYPE_CHECKING:  # torch loads with the first function that computes on tensors, not with agentrl
    import torch


@dataclass(frozen=True)
class StepRewards:
    """One episode's step-level rewards: ``values[k]`` for the step ending at token ``positions[k]``
    (an index into ``Trajectory.token_ids`` of a token the model sampled). Positions are distinct."""

    positions: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        positions, values = tuple(self.positions), tuple(self.values)
        if len(positions) != len(values):
            raise RewardError(f"StepRewards has {len(positions)} positions but {len(values)} values: give one each")
        for p in positions:
            if not isinstance(p, numbers.Integral) or isinstance(p, bool) or p < 0:
                raise RewardError(f"StepRewards position {p!r} is invalid: expected a token index >= 0")
        for v in values:
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v):
                raise RewardError(f"StepRewards value {v!r} is invalid: expected a finite number")
        if len(set(positions)) != len(positions):
            raise RewardError(f"StepRewards positions {list(positions)} repeat: give one value per step")
        object.__setattr__(self, "positions", tuple(int(p) for p in positions))
        object.__setattr__(self, "values", tuple(float(v) for v in values))

    @property
    def total(self) -> float:
        """The sum of the step values (the episode's scalar for this component); NaN without steps."""
        return float(sum(self.values)) if self.values else math.nan

    @classmethod
    def at(cls, positions: Sequence[int], values: Sequence[float]) -> StepRewards:
        """Step rewards at token ``positions`` (e.g. from :func:`step_ends`)."""
        return cls(tuple(positions), tuple(values))

    @classmethod
    def per_turn(cls, trajectory: Trajectory, values: Sequence[float]) -> StepRewards:
        """One step per model turn (that sampled a token), ending at the turn's last sampled token."""
        ends = [turn.end - 1 for turn in trajectory.turns if turn.end > turn.start]
        if len(values) != len(ends):
            raise RewardError(f"StepRewards.per_turn got {len(values)} values for {len(ends)} turns: give one per turn")
        return cls(tuple(ends), tuple(values))


def step_ends(trajectory: Trajectory, tokenizer: Any, separator: str = "\n\n") -> list[int]:
    """Token positions where the steps of the model's turns end: the token whose text completes an
    occurrence of ``separator``, and each turn's last sampled token (the turn's last step, which
    takes a stop token or blanks after a final separator along: no step holds only those). The
    text is each sampled token decoded on its own, concatenated (a separator split over tokens is
    found; a position holds at most one step)."""
    if not separator:
        raise ValueError("step separator '' is invalid: expected a non-empty string such as '\\n\\n'")
    ends: list[int] = []
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    for turn in trajectory.turns:
        if turn.end <= turn.start:
            continue
        pieces = [tokenizer.decode([tid]) for tid in trajectory.token_ids[turn.start : turn.end]]
        text, owner = "", []  # owner[c]: the token position of character c
        for offset, piece in enumerate(pieces):
            text += piece
            owner += [turn.start + offset] * len(piece)
        inside: list[int] = []
        found = text.find(separator)
        while found != -1:
            inside.append(owner[found + len(separator) - 1])
            found = text.find(separator, found + len(separator))
        tail = trajectory.token_ids[inside[-1] + 1 : turn.end] if inside else []
        if inside and all(tid in special or not tokenizer.decode([tid]).strip() for tid in tail):
            inside.pop()  # nothing but the stop token (or blanks) after the last separator: no step of its own
        ends += [*inside, turn.end - 1]
    return sorted(set(ends))


def merge_steps(trajectory: Trajectory, parts: Sequence[tuple[str, StepRewards | float, float]]) -> dict[int, float]:
    """The episode's weighted step rewards by position (module docstring): ``parts`` holds each
    scored component's name, value (a number: an outcome reward at the last sampled token) and
    weight. A RewardError names the component whose position is not a token the model sampled."""
    sampled = [t for t, m in enumerate(trajectory.loss_mask) if m]
    steps: dict[int, float] = {}
    for name, value, weight in parts:
        pairs = (
            list(zip(value.positions, value.values))
            if isinstance(value, StepRewards)
            else ([(sampled[-1], float(value))] if sampled else [])
        )
        for position, reward in pairs:
            if not (position < len(trajectory.loss_mask) and trajectory.loss_mask[position]):
                shown = "none" if not sampled else f"{sampled[0]}..{sampled[-1]} where the loss mask is 1"
                raise RewardError(
                    f"reward {name!r} put a step reward at token {position}, which the model did not "
                    f"sample: expected a position in {shown}"
                )
            steps[position] = steps.get(position, 0.0) + weight * reward
    return steps


def outcome_steps(rewards: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(step_rewards, step_ends)`` ``(N, T)`` of outcome rewards ``(N,)``: one step per scored row
    at its last loss-mask token (a batch no reward function gave step rewards)."""
    import torch

    has_token = loss_mask.sum(dim=1) > 0  # (N,)
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device)  # (T,)
    last = torch.where(loss_mask > 0, positions, -1).max(dim=1).values.clamp(min=0)  # (N,)
    keep = has_token & ~torch.isnan(rewards)  # (N,)
    ends = torch.zeros_like(loss_mask, dtype=torch.float64)
    ends[keep, last[keep]] = 1.0
    values = torch.zeros_like(ends)
    values[keep, last[keep]] = rewards[keep].double()
    return values, ends


def process_advantages(
    step_rewards: torch.Tensor,
    step_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    groups: torch.Tensor,
    scale: str = "group",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token process-supervised advantages ``(N, T)`` (module docstring) of step rewards
    ``(N, T)`` at ``step_mask == 1``; ``scale``: ``"group"`` (pooled group std), ``"batch"``
    (pooled std of every step of the batch, over all processes) or ``"none"``. Stats:
    ``frac_zero_std_groups``, ``abs_mean`` (over the scored steps), ``steps_per_episode``."""
    import torch

    from agentrl.model.distributed import all_sum

    values, is_step = step_rewards.detach().double(), step_mask.detach() > 0  # (N, T)
    _, group_index = torch.unique(groups, return_inverse=True)  # (N,)
    num_groups = int(group_index.max().item()) + 1 if groups.numel() else 0
    row_group = group_index[:, None].expand_as(values)[is_step]  # (S,) the group of each step
    flat = values[is_step]  # (S,)
    count = torch.zeros(num_groups, dtype=torch.float64, device=values.device).index_add_(
        0, row_group, torch.ones_like(flat)
    )
    total = torch.zeros_like(count).index_add_(0, row_group, flat)
    mean = total / count.clamp(min=1.0)  # (K,)
    highest = torch.full_like(mean, -math.inf).scatter_reduce(0, row_group, flat, "amax")
    lowest = torch.full_like(mean, math.inf).scatter_reduce(0, row_group, flat, "amin")
    constant = ~(highest > lowest)  # (K,)
    deviation = torch.where(constant[row_group], torch.zeros_like(flat), flat - mean[row_group])  # (S,)
    if scale == "group":
        variance = torch.zeros_like(count).index_add_(0, row_group, deviation**2) / count.clamp(min=1.0)
        divisor = variance.sqrt().clamp(min=eps)[row_group]  # (S,)
    elif scale == "batch":
        n = all_sum(flat.new_tensor(float(flat.numel())))
        pooled_mean = all_sum(flat.sum()) / n.clamp(min=1.0)
        std = (all_sum(((flat - pooled_mean) ** 2).sum()) / n.clamp(min=1.0)).sqrt()
        divisor = std.clamp(min=eps).expand_as(flat)
    else:
        divisor = torch.ones_like(flat)
    normalised = torch.zeros_like(values)
    normalised[is_step] = deviation / divisor
    advantages = normalised.flip(1).cumsum(1).flip(1) * loss_mask.double()  # (N, T) steps at or after t
    stats = {
        "frac_zero_std_groups": float(constant.double().mean().item()) if num_groups else 0.0,
        "abs_mean": float((deviation / divisor).abs().mean().item()) if flat.numel() else 0.0,
        "steps_per_episode": float(is_step.sum().item()) / max(values.shape[0], 1),
    }
    return advantages.to(loss_mask.dtype), stats
