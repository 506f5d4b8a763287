"""The group-relative core that GRPO and GSPO share (``--algo grpo`` / ``--algo gspo``; the
objective, the papers and how this departs from them are in the ``agentrl_grpo`` plugin's
docstring): each task is sampled G times and episode i's advantage on every token it sampled is
``(R_i - mean_group(R)) / max(std(R), std_epsilon)``; the loss is the clipped-policy loss of
:mod:`agentrl.algorithms.clipped_policy`. Subclass :class:`GroupRelativeConfig` and :class:`GroupRelative`
to change the defaults, as GSPO does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, ClassVar

import torch
from pydantic import Field

from agentrl.algorithms.base import LossContext, LossOutput
from agentrl.algorithms.clipped_policy import ClippedPolicy, ClippedPolicyConfig
from agentrl.algorithms.objectives import KL_ESTIMATORS
from agentrl.config.rules import OneOf
from agentrl.errors import ConfigError
from agentrl.model.distributed import all_sum
from agentrl.rewards.process import outcome_steps, process_advantages
from agentrl.trajectory import TrainBatch


@dataclass(frozen=True)
class GroupRelativeConfig(ClippedPolicyConfig):
    """The ``algorithm:`` options of group-relative algorithms, with GRPO's defaults."""

    epsilon_high: float = 0.28
    """Upper clip range: the ratio is clipped at ``1 + epsilon_high`` (DAPO's clip-higher). >= 0."""
    kl_estimator: Annotated[str, OneOf(*KL_ESTIMATORS)] = "k3"
    """KL estimator in the loss: "k1", "k2" (reverse-KL gradient on-policy) or "k3" (DeepSeekMath)."""
    scale_rewards: Annotated[str, OneOf(*_SCALES)] = "group"
    """Advantage scaling: "group" (group std), "batch" (std over the batch) or "none" (Dr. GRPO)."""
    num_iterations: Annotated[int, Field(ge=1)] = 1
    """Optimizer passes over each rollout batch (GRPO's mu); > 1 makes the clipping matter. >= 1."""
    std_epsilon: Annotated[float, Field(gt=0)] = 1e-4
    """Floor on the std that advantages are divided by. > 0."""
    advantage: Annotated[str, OneOf("outcome", "process")] = "outcome"
    """"outcome": each episode's total on all its tokens; "process": DeepSeekMath's process-supervised
    advantage over the step rewards (:mod:`agentrl.rewards.process`; outcome rewards are steps at
    the last sampled token)."""
    kl_estimator_required: ClassVar[bool] = True


# ---------------------------------------------------------------------------------------------
# Group-relative advantages. Shape letters: N episodes, K groups. Computed in float64.


def _group_sum(values: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device)  # (K,)
    return sums.index_add_(0, group_index, values)


def _group_std(
    deviation: torch.Tensor, rewards: torch.Tensor, weight: torch.Tensor, group_index: torch.Tensor, num_groups: int
) -> torch.Tensor:
    """Population std of each episode's group's scored rewards, per row ``(N,)`` (``weight``:
    each row's share of an episode, 0 for an unscored one)."""
    count = _group_sum(weight, group_index, num_groups).clamp(min=1e-12)  # (K,) scored episodes
    variance = _group_sum(weight * deviation**2, group_index, num_groups) / count  # (K,)
    return variance.sqrt()[group_index]  # (N,)


def _batch_std(
    deviation: torch.Tensor, rewards: torch.Tensor, weight: torch.Tensor, group_index: torch.Tensor, num_groups: int
) -> torch.Tensor:
    """Population std of all scored episodes' rewards in the batch, per row ``(N,)``; over every
    process's share of the batch in a multi-process run (two-pass, global sums)."""
    scored = torch.where(weight > 0, rewards, torch.zeros_like(rewards))  # (N,) NaN-free
    count = all_sum(weight.sum())
    if count == 0:
        return rewards.new_zeros(()).expand_as(rewards)
    mean = all_sum((weight * scored).sum()) / count
    std = (all_sum((weight * (scored - mean) ** 2).sum()) / count).sqrt()
    return std.expand_as(rewards)  # (N,)


def _no_scale(
    deviation: torch.Tensor, rewards: torch.Tensor, weight: torch.Tensor, group_index: torch.Tensor, num_groups: int
) -> torch.Tensor:
    """No scaling (Dr. GRPO): a divisor of 1, per episode ``(N,)``."""
    return torch.ones_like(rewards)  # (N,)


_SCALES: dict[str, Callable[..., torch.Tensor]] = {
    "group": _group_std,
    "batch": _batch_std,
    "none": _no_scale,
}
"""``scale_rewards`` -> per-row std ``(N,)`` that deviations are divided by."""


def group_advantages(
    rewards: torch.Tensor,
    groups: torch.Tensor,
    scale: str = "group",
    eps: float = 1e-4,
    shares: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative advantages ``(N,)`` of rewards ``(N,)`` in groups ``(N,)``, and stats.

    ``(R - group mean) / max(std, eps)`` with ``scale`` choosing the std (see the module
    docstring; ``"none"`` divides by 1). NaN rewards are left out of every mean and std and get
    advantage 0; a group whose scored rewards are all equal (or that has fewer than two) gets
    exactly 0. ``shares`` ``(N,)``: each row's share of its episode (``1 / rows`` when an agent
    episode is several rows, :func:`agentrl.trajectory.with_segments`; default 1), so that every
    episode counts once in the means and stds. Stats (per episode): ``frac_zero_std_groups``,
    ``frac_nan_rewards``, ``abs_mean``.
    """
    if scale not in _SCALES:
        listed = ", ".join(map(repr, sorted(_SCALES)))
        raise ConfigError(f"algorithm.scale_rewards={scale!r} is invalid: expected one of {listed}")
    if rewards.numel() == 0:
        return rewards.clone(), {"frac_zero_std_groups": 0.0, "frac_nan_rewards": 0.0, "abs_mean": 0.0}
    values = rewards.detach().double()  # (N,)
    valid = ~torch.isnan(values)  # (N,)
    share = torch.ones_like(values) if shares is None else shares.detach().to(values)  # (N,)
    weight = torch.where(valid, share, torch.zeros_like(share))  # (N,) a scored row's share of an episode
    _, group_index = torch.unique(groups, return_inverse=True)  # (N,)
    num_groups = int(group_index.max().item()) + 1
    scored = torch.where(valid, values, torch.zeros_like(values))  # (N,)
    count = _group_sum(weight, group_index, num_groups)  # (K,) scored episodes
    mean = _group_sum(weight * scored, group_index, num_groups) / count.clamp(min=1e-12)  # (K,)
    inf = torch.full_like(values, float("inf"))  # (N,)
    highest = torch.full_like(mean, -float("inf")).scatter_reduce(
        0, group_index, torch.where(valid, values, -inf), "amax"
    )  # (K,)
    lowest = torch.full_like(mean, float("inf")).scatter_reduce(
        0, group_index, torch.where(valid, values, inf), "amin"
    )  # (K,)
    constant = ~(highest > lowest)  # (K,) all scored rewards equal, or fewer than two scored
    varies = valid & ~constant[group_index]  # (N,)
    deviation = torch.where(varies, values - mean[group_index], torch.zeros_like(values))  # (N,)
    std = _SCALES[scale](deviation, values, weight, group_index, num_groups)  # (N,)
    divisor = std.clamp(min=eps) if scale != "none" else std  # (N,)
    advantages = deviation / divisor  # (N,)
    episodes = share.sum()
    stats = {
        "frac_zero_std_groups": float(constant.double().mean().item()),
        "frac_nan_rewards": float((share * ~valid).sum() / episodes),
        "abs_mean": float((share * advantages.abs()).sum() / episodes),
    }
    return advantages.to(rewards.dtype), stats


class GroupRelative(ClippedPolicy):
    """GRPO's algorithm (advantages relative to the task's group, the clipped-policy loss)."""

    config_class = GroupRelativeConfig
    config: GroupRelativeConfig
    min_group_size = 2
    """Advantages compare a task's episodes with each other: one episode per task trains nothing."""

    @property
    def num_iterations(self) -> int:
        """Optimizer passes over each rollout batch (``config.num_iterations``)."""
        return self.config.num_iterations

    def compute_advantages(self, batch: TrainBatch, metrics: dict[str, float]) -> torch.Tensor:
        """Each episode's group advantage on all its loss-mask tokens, ``(N, T)`` (``advantage:
        process``: the process-supervised advantage of :mod:`agentrl.rewards.process`); logs
        ``advantage/frac_zero_std_groups``, ``advantage/frac_nan_rewards``, ``advantage/abs_mean``."""
        mask = batch.loss_mask
        if self.config.advantage == "process":
            if "step_ends" in batch.extras:
                steps, ends = batch.extras["step_rewards"], batch.extras["step_ends"]
            else:  # no reward function returned step rewards: each episode's total is its one step
                steps, ends = outcome_steps(batch.rewards, mask)
            per_token, stats = process_advantages(
                steps, ends, mask, batch.groups, self.config.scale_rewards, self.config.std_epsilon
            )
            metrics.update({f"advantage/{name}": value for name, value in stats.items()})
            return per_token
        advantages, stats = group_advantages(
            batch.rewards,
            batch.groups,
            self.config.scale_rewards,
            self.config.std_epsilon,
            batch.extras.get("episode_shares"),
        )  # (N,)
        metrics.update({f"advantage/{name}": value for name, value in stats.items()})
        return advantages.to(device=mask.device, dtype=mask.dtype)[:, None] * mask  # (N, T)

    def inert_rows(self, batch: TrainBatch) -> torch.Tensor | None:
        """Rows whose advantage is 0 on every loss token (a group whose rewards are all equal),
        when the loss has no KL term: the clipped surrogate and the per-token factors multiply the
        advantage, so such a row's gradient is exactly 0. None with ``beta > 0`` (the KL term
        pulls every row toward the reference)."""
        if self.kl_in_loss() is not None:
            return None
        return ((batch.extras["advantages"] == 0) | (batch.loss_mask == 0)).all(dim=1)  # (N,)

    def loss(self, context: LossContext) -> LossOutput:
        """Clipped surrogate (+ ``beta`` x KL) aggregated by ``loss_type``; token stats
        ``clip/low``, ``clip/high``, ``clip/region`` (and ``clip/delta``, ``kl`` when enabled)."""
        loss, token_stats = self.clipped_policy_loss(context)
        return LossOutput(loss=loss, token_stats=token_stats, scalars={"loss/policy": float(loss.detach())})
