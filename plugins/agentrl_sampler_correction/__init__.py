"""Sampler/trainer mismatch correction: truncated (TIS) or masked (MIS) importance sampling.

The engine that samples (a bf16 copy in ``hf``, vLLM) and the trainer that scores do not compute
the same probabilities, so the data is slightly off-policy even on the first optimizer step. Three
log-probabilities of each sampled token are kept apart by name:

* ``sampler``: the engine's (``batch.sampler_logprobs``; full vocabulary at the sampling
  temperature, the same support as the trainer's even with top_k/top_p);
* ``trainer-old``: the trainer's forward of the policy before this step's updates
  (``batch.extras["old_logprobs"]``; this plugin asks for it even with one optimizer step): the
  policy that sampled the batch in a synchronous run; in an asynchronous one (``async_steps``) the
  sampler was up to ``async_steps`` versions older, and ``w`` below corrects that staleness too
  (the decoupled objective: the ratio clips around the current policy, ``w`` re-weights the data);
* ``current``: the policy being optimised (the loss's ratio is current / trainer-old).

With ``w = pi_old / pi_sampler`` the policy-gradient loss is corrected by (Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training"):

* ``tis``: multiply each token's policy loss by ``min(w, cap)`` (no gradient);
* ``mis``: drop from the loss (mask) the tokens, or whole sequences, whose ``w`` leaves
  ``[lower, cap]``; the loss denominators are then counted on the final mask.

``level``: ``token`` (``w`` per token), ``sequence`` (the product of a sequence's token ratios,
the unbiased sequence-level weight) or ``geometric`` (their geometric mean, GSPO-style
length-normalised). ``measure`` computes and logs the mismatch without changing the loss.

Enable with ``--set plugins.sampler_correction.mode=tis`` (see ``agentrl train --print-config``);
the default ``auto`` is ``tis`` in an asynchronous run and ``off`` in a synchronous one.
Per rollout batch it logs ``mismatch/kl`` (k3 estimate of KL(sampler || trainer-old) per token),
``mismatch/k1``, ``mismatch/abs_log_ratio``, ``mismatch/ratio_mean|min|max`` (of ``w`` at
``level``), ``mismatch/frac_truncated`` (tis: share of weights above ``cap``) and
``mismatch/frac_masked`` (mis: share of tokens or sequences dropped).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from agentrl import Allowed, ConfigCheck, OneOf, TrainBatch, hookimpl, masked

MODES = ("auto", "off", "measure", "tis", "mis")
LEVELS = ("token", "sequence", "geometric")
SECTION = "sampler_correction"


@dataclass(frozen=True)
class SamplerCorrectionConfig:
    """The ``plugins.sampler_correction`` section."""

    mode: Annotated[str, OneOf(*MODES), Allowed(f"expected one of {', '.join(MODES)}")] = "auto"
    """"off", "measure" (log the mismatch only), "tis" (truncated IS), "mis" (masked IS), or "auto":
    "tis" in an asynchronous run (``async_steps`` > 0: stale episodes are corrected), else "off"."""
    level: Annotated[str, OneOf(*LEVELS), Allowed(f"expected one of {', '.join(LEVELS)}")] = "token"
    """"token", "sequence" (product of token ratios) or "geometric" (their geometric mean)."""
    cap: Annotated[float, Field(gt=1), Allowed("expected a finite number > 1")] = 2.0
    """Truncation cap of the weight (tis) and upper bound of the kept range (mis). > 1."""
    lower: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Lower bound of the kept range for mis (None: 1 / cap). In (0, 1)."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        ConfigCheck(self, f"plugins.{SECTION}").declared()

    @property
    def low(self) -> float:
        """The lower bound of the kept range (mis)."""
        return 1.0 / self.cap if self.lower is None else float(self.lower)


def log_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor, level: str
) -> torch.Tensor:
    """``log(pi_old / pi_sampler)`` at ``level``: ``(n, T)`` for token (0 off the mask), ``(n, 1)``
    for sequence (sum over the row's loss-mask tokens) and geometric (their mean)."""
    per_token = masked(old_logprobs.detach() - sampler_logprobs, loss_mask)  # (n, T)
    if level == "token":
        return per_token
    sums = per_token.sum(dim=-1, keepdim=True)  # (n, 1)
    if level == "sequence":
        return sums
    return sums / loss_mask.sum(dim=-1, keepdim=True).clamp(min=1.0)  # (n, 1)


def _section(settings: dict[str, Any]) -> SamplerCorrectionConfig:
    return settings.get(SECTION) or SamplerCorrectionConfig()


def _mode(config: Any, settings: dict[str, Any]) -> str:
    """The mode in force: ``auto`` is ``tis`` in an asynchronous run, ``off`` in a synchronous one."""
    mode = _section(settings).mode
    if mode == "auto":
        return "tis" if getattr(config, "async_steps", 0) > 0 else "off"
    return mode


def _units(loss_mask: torch.Tensor, level: str) -> torch.Tensor:
    """Which entries of a level's weights are real: tokens on the mask, or rows with a token."""
    return loss_mask > 0 if level == "token" else (loss_mask.sum(dim=-1, keepdim=True) > 0)


@hookimpl
def agentrl_register_settings(register: Callable[..., None]) -> None:
    """Register the ``plugins.sampler_correction`` section."""
    register(SECTION, SamplerCorrectionConfig)


@hookimpl
def agentrl_needs_old_logprobs(config: Any, settings: dict[str, Any]) -> bool:
    """The trainer-old logprobs are needed whenever the correction is not off."""
    return _mode(config, settings) != "off"


@hookimpl
def agentrl_adjust_loss_mask(
    batch: TrainBatch, config: Any, settings: dict[str, Any], metrics: dict[str, float]
) -> torch.Tensor | None:
    """Log the mismatch of the rollout batch; for ``mis`` return the mask keeping weights in range."""
    cfg, mode = _section(settings), _mode(config, settings)
    if mode == "off":
        return None
    if "old_logprobs" not in batch.extras:
        raise RuntimeError(
            "sampler_correction needs batch.extras['old_logprobs'] before the loss mask is "
            "adjusted; the trainer computes them when agentrl_needs_old_logprobs says so"
        )
    mask, old = batch.loss_mask, batch.extras["old_logprobs"]
    token_log_w = log_weights(old, batch.sampler_logprobs, mask, "token")  # (N, T)
    on = mask > 0  # (N, T)
    num_tokens = max(int(on.sum()), 1)
    metrics["mismatch/kl"] = float(masked(torch.expm1(token_log_w) - token_log_w, mask).sum()) / num_tokens
    metrics["mismatch/k1"] = float(-token_log_w.sum()) / num_tokens
    metrics["mismatch/abs_log_ratio"] = float(token_log_w.abs().sum()) / num_tokens
    log_w = log_weights(old, batch.sampler_logprobs, mask, cfg.level)  # (N, T) or (N, 1)
    units = torch.broadcast_to(_units(mask, cfg.level), log_w.shape)
    if not bool(units.any()):
        return None
    ratios = torch.exp(log_w.clamp(max=80.0))[units]  # (U,)
    metrics["mismatch/ratio_mean"] = float(ratios.mean())
    metrics["mismatch/ratio_min"] = float(ratios.min())
    metrics["mismatch/ratio_max"] = float(ratios.max())
    metrics["mismatch/frac_truncated"] = float((ratios > cfg.cap).float().mean()) if mode == "tis" else 0.0
    if mode != "mis":
        return None
    keep = (log_w >= math.log(cfg.low)) & (log_w <= math.log(cfg.cap))  # (N, T) or (N, 1)
    metrics["mismatch/frac_masked"] = float((~keep[units]).float().mean())
    return torch.broadcast_to(keep, mask.shape).to(mask.dtype)  # (N, T)


@hookimpl
def agentrl_per_token_loss_factors(
    batch: TrainBatch, old_logprobs: torch.Tensor, config: Any, settings: dict[str, Any]
) -> torch.Tensor | None:
    """For ``tis``: ``min(pi_old / pi_sampler, cap)`` per token ``(n, T)`` or per sequence ``(n, 1)``."""
    cfg = _section(settings)
    if _mode(config, settings) != "tis":
        return None
    log_w = log_weights(old_logprobs, batch.sampler_logprobs, batch.loss_mask, cfg.level)
    return torch.exp(log_w.clamp(max=math.log(cfg.cap)))  # min(w, cap) without overflow
