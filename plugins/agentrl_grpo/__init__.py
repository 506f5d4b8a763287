"""GRPO: group-relative policy optimisation, with the DAPO and Dr. GRPO variants.

Objective (DeepSeekMath, arXiv 2402.03300). Each task is sampled G times (a group); episode i
gets one scalar reward R_i and every token t the model sampled in it gets the same advantage

    A_i = (R_i - mean_group(R)) / max(std(R), std_epsilon)

and the policy minimises, per optimizer step,

    L = (1 / Z) * sum_i sum_t m_it * ( -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)
                                        + beta * KL_it )

with r_it = pi_theta(token) / pi_old(token) (the importance weight; a plugin may make it
sequence-level), m the loss mask and Z set by ``loss_type`` (see :mod:`agentrl.objectives`).

How this departs from the papers, on purpose:

* ``loss_type="dapo"`` by default (DAPO, arXiv 2503.14476): token-level sum over the whole rollout
  batch's token count, not DeepSeekMath's per-sequence mean (``"grpo"``, length-biased, offered).
  ``"dr_grpo"`` (Dr. GRPO, arXiv 2503.20783) divides by sequences x the configured
  ``max_completion_length``; ``"bnpo"`` by the optimizer step's token count.
* Clip-higher by default (DAPO): ``epsilon_high=0.28`` against ``epsilon_low=0.2``.
  ``delta`` adds two-sided clipping (INTELLECT-2, arXiv 2505.07291): the unclipped term uses
  ``min(r, delta)``, so negative-advantage tokens with runaway ratios stay bounded.
* ``beta=0`` by default (no reference model, as DAPO and Dr. GRPO); DeepSeekMath used 0.04 with
  the k3 estimator. ``kl_estimator`` picks k1/k2/k3; k3 stays the default for familiarity, but
  only k2's gradient is the reverse-KL gradient on-policy (TRAPS.md 20).
* The std is the population std (divide by the number of scored episodes) of the group, floored
  at ``std_epsilon`` instead of ``+ eps`` (TRL uses the unbiased std plus eps). ``"batch"`` keeps
  the group mean but divides by the std of the whole batch's rewards; ``"none"`` does not scale
  (Dr. GRPO). A group whose rewards are all equal gets advantage exactly 0 (TRAPS.md 15).
* Rewards that are NaN (a reward function returned None) are left out of the group statistics and
  their episodes get advantage 0 (TRAPS.md 17).
* Multi-turn: an episode's advantage covers every token the model sampled in any turn; env and
  tool tokens are off the loss mask. No dynamic sampling or soft overlong penalty (DAPO);
  truncated episodes can be masked with the trainer's ``mask_truncated_completions``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentrl import (
    AGGREGATIONS,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    Algorithm,
    ConfigCheck,
    ConfigError,
    LossContext,
    LossOutput,
    TrainBatch,
    all_sum,
    hookimpl,
    masked,
    policy_loss,
)


@dataclass(frozen=True)
class GRPOConfig:
    """The ``algorithm:`` section for ``--algo grpo``."""

    epsilon_low: float = 0.2
    """Lower clip range: the ratio is clipped at ``1 - epsilon_low``. In [0, 1)."""
    epsilon_high: float = 0.28
    """Upper clip range: the ratio is clipped at ``1 + epsilon_high`` (DAPO's clip-higher). >= 0."""
    delta: float | None = None
    """Two-sided clipping (INTELLECT-2): cap on the unclipped ratio, > 1 + epsilon_high; None: off."""
    beta: float = 0.0
    """KL penalty coefficient in the loss; > 0 loads a frozen reference model. >= 0."""
    kl_estimator: str = "k3"
    """KL estimator in the loss: "k1", "k2" (reverse-KL gradient on-policy) or "k3" (DeepSeekMath)."""
    scale_rewards: str = "group"
    """Advantage scaling: "group" (group std), "batch" (std over the batch) or "none" (Dr. GRPO)."""
    loss_type: str = "dapo"
    """Aggregation: "dapo" (rollout tokens), "bnpo" (step tokens), "grpo" (per-sequence mean), "dr_grpo"."""
    num_iterations: int = 1
    """Optimizer passes over each rollout batch (GRPO's mu); > 1 makes the clipping matter. >= 1."""
    mini_batches: int = 1
    """Optimizer steps per pass: the rollout batch's episodes are split into this many parts
    (TRL's steps_per_generation); > 1 makes the clipping matter. >= 1."""
    importance_sampling_level: str = "token"
    """Importance ratio: "token" (GRPO), "sequence" (GSPO: the length-normalised sequence ratio,
    clipped per sequence) or "sequence_token" (GSPO-token)."""
    std_epsilon: float = 1e-4
    """Floor on the std that advantages are divided by. > 0."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        check = ConfigCheck(self, "algorithm")
        check.clipping()
        check.choice("kl_estimator", KL_ESTIMATORS)
        check.choice("scale_rewards", _SCALES)
        check.choice("loss_type", AGGREGATIONS)
        check.integer("num_iterations", low=1)
        check.integer("mini_batches", low=1)
        check.choice("importance_sampling_level", IMPORTANCE_LEVELS)
        check.number("std_epsilon", low=0, low_open=True)


# ---------------------------------------------------------------------------------------------
# Group-relative advantages. Shape letters: N episodes, K groups. Computed in float64.


def _group_sum(values: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device)  # (K,)
    return sums.index_add_(0, group_index, values)


def _group_std(deviation: torch.Tensor, rewards: torch.Tensor, valid: torch.Tensor,
               group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Population std of each episode's group's scored rewards, per episode ``(N,)``."""
    count = _group_sum(valid.double(), group_index, num_groups).clamp(min=1.0)  # (K,)
    variance = _group_sum(deviation**2, group_index, num_groups) / count  # (K,)
    return variance.sqrt()[group_index]  # (N,)


def _batch_std(deviation: torch.Tensor, rewards: torch.Tensor, valid: torch.Tensor,
               group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Population std of all scored rewards in the batch, per episode ``(N,)``; over every
    process's share of the batch in a multi-process run (two-pass, global sums)."""
    scored = rewards[valid]  # (V,)
    count = all_sum(scored.new_tensor(float(scored.numel())))
    if count == 0:
        return rewards.new_zeros(()).expand_as(rewards)
    mean = all_sum(scored.sum()) / count
    std = (all_sum(((scored - mean) ** 2).sum()) / count).sqrt()
    return std.expand_as(rewards)  # (N,)


def _no_scale(deviation: torch.Tensor, rewards: torch.Tensor, valid: torch.Tensor,
              group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """No scaling (Dr. GRPO): a divisor of 1, per episode ``(N,)``."""
    return torch.ones_like(rewards)  # (N,)


_SCALES: dict[str, Callable[..., torch.Tensor]] = {
    "group": _group_std,
    "batch": _batch_std,
    "none": _no_scale,
}
"""``scale_rewards`` -> per-episode std ``(N,)`` that deviations are divided by."""


def group_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, scale: str = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative advantages ``(N,)`` of rewards ``(N,)`` in groups ``(N,)``, and stats.

    ``(R - group mean) / max(std, eps)`` with ``scale`` choosing the std (see the module
    docstring; ``"none"`` divides by 1). NaN rewards are left out of every mean and std and get
    advantage 0; a group whose scored rewards are all equal (or that has fewer than two) gets
    exactly 0. Stats: ``frac_zero_std_groups``, ``frac_nan_rewards``, ``abs_mean``.
    """
    if scale not in _SCALES:
        listed = ", ".join(map(repr, sorted(_SCALES)))
        raise ConfigError(f"algorithm.scale_rewards={scale!r} is invalid: expected one of {listed}")
    if rewards.numel() == 0:
        return rewards.clone(), {"frac_zero_std_groups": 0.0, "frac_nan_rewards": 0.0, "abs_mean": 0.0}
    values = rewards.detach().double()  # (N,)
    valid = ~torch.isnan(values)  # (N,)
    _, group_index = torch.unique(groups, return_inverse=True)  # (N,)
    num_groups = int(group_index.max().item()) + 1
    scored = torch.where(valid, values, torch.zeros_like(values))  # (N,)
    count = _group_sum(valid.double(), group_index, num_groups)  # (K,)
    mean = _group_sum(scored, group_index, num_groups) / count.clamp(min=1.0)  # (K,)
    inf = torch.full_like(values, float("inf"))  # (N,)
    highest = torch.full_like(mean, -float("inf")).scatter_reduce(
        0, group_index, torch.where(valid, values, -inf), "amax")  # (K,)
    lowest = torch.full_like(mean, float("inf")).scatter_reduce(
        0, group_index, torch.where(valid, values, inf), "amin")  # (K,)
    constant = ~(highest > lowest)  # (K,) all scored rewards equal, or fewer than two scored
    varies = valid & ~constant[group_index]  # (N,)
    deviation = torch.where(varies, values - mean[group_index], torch.zeros_like(values))  # (N,)
    std = _SCALES[scale](deviation, values, valid, group_index, num_groups)  # (N,)
    divisor = std.clamp(min=eps) if scale != "none" else std  # (N,)
    advantages = deviation / divisor  # (N,)
    stats = {
        "frac_zero_std_groups": float(constant.double().mean().item()),
        "frac_nan_rewards": float((~valid).double().mean().item()),
        "abs_mean": float(advantages.abs().mean().item()),
    }
    return advantages.to(rewards.dtype), stats


# ---------------------------------------------------------------------------------------------
# The algorithm.


class GRPO(Algorithm):
    """GRPO / DAPO / Dr. GRPO (module docstring). ``agentrl train --algo grpo``."""

    config_class = GRPOConfig
    config: GRPOConfig
    min_group_size = 2
    """Advantages compare a task's episodes with each other: one episode per task trains nothing."""

    @property
    def needs_reference(self) -> bool:
        """A reference model is needed only for the KL term (``beta > 0``)."""
        return self.config.beta > 0

    @property
    def num_iterations(self) -> int:
        """Optimizer passes over each rollout batch (``config.num_iterations``)."""
        return self.config.num_iterations

    @property
    def num_mini_batches(self) -> int:
        """Optimizer steps per pass (``config.mini_batches``)."""
        return self.config.mini_batches

    def compute_advantages(self, batch: TrainBatch, metrics: dict[str, float]) -> torch.Tensor:
        """Each episode's group advantage on all its loss-mask tokens, ``(N, T)``; logs
        ``advantage/frac_zero_std_groups``, ``advantage/frac_nan_rewards``, ``advantage/abs_mean``."""
        advantages, stats = group_advantages(
            batch.rewards, batch.groups, self.config.scale_rewards, self.config.std_epsilon
        )  # (N,)
        metrics.update({f"advantage/{name}": value for name, value in stats.items()})
        mask = batch.loss_mask
        return advantages.to(device=mask.device, dtype=mask.dtype)[:, None] * mask  # (N, T)

    def loss(self, context: LossContext) -> LossOutput:
        """Clipped surrogate (+ ``beta`` x KL) aggregated by ``loss_type``; token stats
        ``clip/low``, ``clip/high``, ``clip/region`` (and ``clip/delta``, ``kl`` when enabled)."""
        batch, logprobs, config = context.batch, context.logprobs, self.config
        if "advantages" not in batch.extras:
            raise KeyError("GRPO.loss needs batch.extras['advantages'] (from compute_advantages)")
        per_token_loss, token_stats = policy_loss(
            batch=batch,
            logprobs=logprobs,
            old_logprobs=context.old_logprobs,
            advantages=batch.extras["advantages"],
            hook=context.hook,
            train_config=context.config,
            metrics=context.metrics,
            epsilon_low=config.epsilon_low,
            epsilon_high=config.epsilon_high,
            delta=config.delta,
            importance_sampling_level=config.importance_sampling_level,
            settings=context.settings,
        )  # (n, T)
        if config.beta > 0:
            if context.ref_logprobs is None:
                raise ValueError("GRPO with beta > 0 needs ref_logprobs: the trainer must load a reference")
            mask = batch.loss_mask
            estimator = KL_ESTIMATORS[config.kl_estimator]
            kl = estimator(masked(logprobs, mask), masked(context.ref_logprobs.detach(), mask))  # (n, T)
            per_token_loss = per_token_loss + config.beta * kl
            token_stats["kl"] = kl.detach()
        loss = AGGREGATIONS[config.loss_type](per_token_loss, batch.loss_mask, context.totals)
        return LossOutput(loss=loss, token_stats=token_stats, scalars={"loss/policy": float(loss.detach())})


@hookimpl
def agentrl_register_algorithms(register: Callable[..., None]) -> None:
    """Register ``grpo``."""
    register("grpo", GRPO)
