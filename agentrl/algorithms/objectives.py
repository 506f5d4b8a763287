"""Algorithm-agnostic pieces of the policy loss: KL estimators, the clipped surrogate, the
aggregation modes and the step totals they divide by. Pure functions on tensors; GRPO and PPO
share them, and :func:`policy_loss` calls the step hooks so plugins reach every algorithm.

Shape letters: n = rows of a micro-batch, T = its padded width, N = rows of a rollout batch.
Per-token tensors follow :mod:`agentrl.trajectory`'s alignment (index t is token t).

Normalisation contract (docs/concepts/guards.md#normalisation): an aggregation mode divides each micro-batch's token sum
by a denominator taken from :class:`agentrl.StepTotals`, counted over *every* micro-batch and
process of the optimizer step before the first backward. Summing the micro-batch losses of all
micro-batches and all processes therefore gives exactly the full-batch loss, however the step is
split. Gradient accumulation must not rescale it again; under DDP, which averages gradients over
processes, the trainer multiplies each process's loss by the number of processes, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agentrl.algorithms.base import StepTotals
from agentrl.trajectory import TrainBatch

# ---------------------------------------------------------------------------------------------
# KL estimators: each (logprobs, ref_logprobs) -> per-token estimate of KL(pi || ref) at the
# sampled token, with log r = ref_logprobs - logprobs. All three are unbiased or non-negative
# *values*; their *gradients* differ (Tang & Munos, arXiv 2506.09477; docs/concepts/guards.md#kl-estimators).


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = -log r = logprobs - ref_logprobs: unbiased value of KL(pi || ref).

    In a loss, its on-policy expected gradient is zero (it is the score function's mean), so it
    does not pull towards the reference. Use it as a reward-side penalty, with no gradient.
    """
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (log r)**2: biased value, but on-policy its expected gradient *is* the
    gradient of the reverse KL(pi || ref). The estimator to put in the loss."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = r - log r - 1: unbiased, non-negative value (Schulman's estimator, DeepSeekMath, TRL).

    In the loss its on-policy expected gradient is that of the *forward* KL(ref || pi), not the
    reverse KL it estimates: biased as a gradient (docs/concepts/guards.md#kl-estimators). Offered as the familiar
    default.
    """
    log_r = ref_logprobs - logprobs
    return torch.exp(log_r) - log_r - 1.0


KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
"""Name -> KL estimator ``(logprobs, ref_logprobs) -> (n, T)``."""


# ---------------------------------------------------------------------------------------------
# Masking and the clipped surrogate.


def masked(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``loss_mask`` is set, exactly 0 elsewhere (no NaN/inf leaks, in either
    direction of autograd, from padding or prompt positions)."""
    return torch.where(loss_mask > 0, values, torch.zeros_like(values))


def masked_mean(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the loss mask (0 for an empty mask); for logging, not losses."""
    values = torch.broadcast_to(values, loss_mask.shape)
    return masked(values, loss_mask).sum() / loss_mask.sum().clamp(min=1.0)


def clipped_surrogate(
    log_weights: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate loss ``-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)``.

    ``log_weights`` ``(n, T)`` or ``(n, 1)``: log importance weights, ``r = exp(log_weights)``;
    ``advantages`` ``(n, T)``. Only the second term is clipped; the min then keeps the
    pessimistic one. With ``delta`` (two-sided clipping, INTELLECT-2) the unclipped term uses
    ``min(r, delta)``, bounding the loss of negative-advantage tokens whose ratio ran away.

    Stats (detached float ``(n, T)``, 1 where true): ``clip/low`` the clipped term is active on
    the low side (``r < 1 - eps_low`` and ``A < 0``), ``clip/high`` on the high side
    (``r > 1 + eps_high`` and ``A > 0``), ``clip/region`` either; with ``delta``, ``clip/delta``
    marks ``r > delta`` and ``A < 0``.
    """
    ratio, advantages = torch.broadcast_tensors(torch.exp(log_weights), advantages)  # (n, T)
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)  # (n, T)
    unclipped_ratio = ratio if delta is None else torch.clamp(ratio, max=delta)  # (n, T)
    per_token_loss = -torch.minimum(unclipped_ratio * advantages, clipped_ratio * advantages)
    with torch.no_grad():
        low = (ratio < 1.0 - epsilon_low) & (advantages < 0)  # (n, T)
        high = (ratio > 1.0 + epsilon_high) & (advantages > 0)  # (n, T)
        stats = {"clip/low": low.float(), "clip/high": high.float(), "clip/region": (low | high).float()}
        if delta is not None:
            stats["clip/delta"] = ((ratio > delta) & (advantages < 0)).float()
    return per_token_loss, stats


# ---------------------------------------------------------------------------------------------
# Importance-sampling levels: (log_ratio (n, T), loss_mask (n, T)) -> log importance weights.
# log_ratio = logprobs - old_logprobs carries the gradient (old is detached); 0 off the mask.


def sequence_mean_log_ratio(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``(n, 1)`` mean of each row's log-ratios over its loss-mask tokens (every token the model
    sampled in the episode, all turns; env tokens excluded): the log of GSPO's length-normalised
    sequence ratio ``s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|)``. 0 for an empty row."""
    sums = masked(log_ratio, loss_mask).sum(dim=-1, keepdim=True)  # (n, 1)
    return sums / loss_mask.sum(dim=-1, keepdim=True).clamp(min=1.0)  # (n, 1)


def token_log_weights(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``token`` (PPO, GRPO): each token's own ratio, ``(n, T)``."""
    return log_ratio


def sequence_log_weights(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``sequence`` (GSPO, arXiv 2507.18071): one ratio ``s_i`` per sequence, ``(n, 1)``; its
    gradient is ``s_i`` times the *mean* of the sequence's token score functions."""
    return sequence_mean_log_ratio(log_ratio, loss_mask)


def sequence_token_log_weights(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``sequence_token`` (GSPO-token): ``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]``, ``(n, T)``.
    Its value is ``s_i`` on every token, its gradient ``s_i`` times that token's score function,
    so per-token advantages (PPO) fit; with one advantage per sequence it equals ``sequence``."""
    return sequence_mean_log_ratio(log_ratio, loss_mask).detach() + log_ratio - log_ratio.detach()


IMPORTANCE_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": token_log_weights,
    "sequence": sequence_log_weights,
    "sequence_token": sequence_token_log_weights,
}
"""``importance_sampling_level`` -> log importance weights ``(log_ratio, loss_mask) -> (n, T | 1)``."""


def importance_log_weights(log_ratio: torch.Tensor, loss_mask: torch.Tensor, level: str) -> torch.Tensor:
    """Log importance weights at ``level`` (a key of :data:`IMPORTANCE_LEVELS`)."""
    if level not in IMPORTANCE_LEVELS:
        raise ValueError(f"importance_sampling_level {level!r} is not one of {', '.join(IMPORTANCE_LEVELS)}")
    return IMPORTANCE_LEVELS[level](log_ratio, loss_mask)


# ---------------------------------------------------------------------------------------------
# Aggregation modes: (per_token_loss (n, T), loss_mask (n, T), totals) -> this micro-batch's
# share of the step loss. Denominators are step-wide constants clamped to >= 1, so a fully
# masked micro-batch contributes an exact 0 with its graph still connected.


def aggregate_grpo(per_token_loss: torch.Tensor, loss_mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """``grpo`` (DeepSeekMath): each sequence's token mean, averaged over the step's sequences.
    Short sequences weigh more per token (the length bias Dr. GRPO points out)."""
    token_sums = masked(per_token_loss, loss_mask).sum(dim=-1)  # (n,)
    sequence_means = token_sums / loss_mask.sum(dim=-1).clamp(min=1.0)  # (n,)
    return sequence_means.sum() / max(1.0, float(totals.num_sequences))


def aggregate_bnpo(per_token_loss: torch.Tensor, loss_mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """``bnpo``: token sum over the loss-mask tokens of the optimizer step (a global token mean)."""
    return masked(per_token_loss, loss_mask).sum() / max(1.0, float(totals.num_tokens))


def aggregate_dapo(per_token_loss: torch.Tensor, loss_mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """``dapo`` (token-level, arXiv 2503.14476): token sum over the loss-mask tokens of the
    whole rollout batch, so every token of a rollout weighs the same in every optimizer step."""
    return masked(per_token_loss, loss_mask).sum() / max(1.0, float(totals.num_tokens_rollout))


def aggregate_dr_grpo(per_token_loss: torch.Tensor, loss_mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """``dr_grpo`` (arXiv 2503.20783): token sum over the constant ``sequences x
    max_completion_length`` (the configured cap, never this batch's padded width)."""
    denominator = float(totals.num_sequences) * float(totals.max_completion_length)
    return masked(per_token_loss, loss_mask).sum() / max(1.0, denominator)


Aggregation = Callable[[torch.Tensor, torch.Tensor, StepTotals], torch.Tensor]
AGGREGATIONS: dict[str, Aggregation] = {
    "grpo": aggregate_grpo,
    "bnpo": aggregate_bnpo,
    "dapo": aggregate_dapo,
    "dr_grpo": aggregate_dr_grpo,
}
"""Name -> aggregation mode ``(per_token_loss, loss_mask, totals) -> scalar``."""


def step_totals(
    loss_masks: list[torch.Tensor],
    num_tokens_rollout: float,
    max_completion_length: int,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepTotals:
    """Count one optimizer step's denominators over its micro-batches' final loss masks.

    ``loss_masks``: this process's micro-batch masks ``(n, T)`` for the step (after every
    ``agentrl_adjust_loss_mask``); ``num_tokens_rollout``: loss-mask tokens of the whole rollout
    batch, already summed over processes (passed through unchanged). ``reduce``, when given,
    sums a tensor over processes (the trainer passes accelerate's ``reduce(..., "sum")``); the
    token and sequence counts go through it.
    """
    device = loss_masks[0].device if loss_masks else torch.device("cpu")
    num_tokens = sum((float(mask.sum().item()) for mask in loss_masks), 0.0)
    # A fully masked row (a masked truncated episode) adds nothing to the loss, so it must not
    # dilute the per-sequence modes either: count only rows with at least one loss token.
    num_sequences = sum((int((mask.sum(dim=-1) > 0).sum().item()) for mask in loss_masks), 0)
    counts = torch.tensor([num_tokens, float(num_sequences)], dtype=torch.float64, device=device)  # (2,)
    if reduce is not None:
        counts = reduce(counts)
    tokens, sequences = (float(c) for c in counts.tolist())
    return StepTotals(
        num_tokens=tokens,
        num_sequences=sequences,
        num_tokens_rollout=float(num_tokens_rollout),
        max_completion_length=int(max_completion_length),
    )


# ---------------------------------------------------------------------------------------------
# The shared per-micro-batch policy-loss pipeline.


def policy_loss(
    *,
    batch: TrainBatch,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    hook: Any,
    train_config: Any,
    metrics: dict[str, float],
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    settings: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token policy loss ``(n, T)`` of one micro-batch and its clip stats, before KL and
    aggregation.

    1. ``log_ratio = logprobs - old_logprobs`` (0 off the loss mask);
    2. ``agentrl_importance_weights`` (firstresult) turns it into log importance weights; the
       core's default is :func:`importance_log_weights` at ``importance_sampling_level``;
    3. :func:`clipped_surrogate` with ``advantages`` ``(n, T)``;
    4. every non-None ``agentrl_per_token_loss_factors`` result is multiplied in, detached.

    ``settings``: the run's plugin settings sections, passed to the hooks. Everything is zeroed
    off the loss mask, so padding can never leak NaN into the gradient.
    """
    settings = {} if settings is None else settings
    loss_mask = batch.loss_mask
    log_ratio = masked(logprobs - old_logprobs.detach(), loss_mask)  # (n, T)
    log_weights = hook.agentrl_importance_weights(
        log_ratio=log_ratio,
        loss_mask=loss_mask,
        level=importance_sampling_level,
        config=train_config,
        settings=settings,
        metrics=metrics,
    )
    if log_weights is None:
        log_weights = importance_log_weights(log_ratio, loss_mask, importance_sampling_level)
    log_weights = masked(torch.broadcast_to(log_weights, loss_mask.shape), loss_mask)  # (n, T)
    per_token_loss, stats = clipped_surrogate(log_weights, advantages, epsilon_low, epsilon_high, delta)
    factors = hook.agentrl_per_token_loss_factors(
        batch=batch,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        config=train_config,
        settings=settings,
        metrics=metrics,
    )
    for factor in factors:
        if factor is not None:
            factor = torch.broadcast_to(factor.detach(), loss_mask.shape)  # (n, T)
            per_token_loss = per_token_loss * masked(factor, loss_mask)  # (n, T)
    return per_token_loss, stats
