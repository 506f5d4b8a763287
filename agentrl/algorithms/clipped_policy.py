"""The clipped-policy family's shared options and loss: GRPO, GSPO and PPO (and any plugin that
subclasses :class:`ClippedPolicy`) take the same clipping, KL, aggregation and importance-sampling
options and minimise the same per-micro-batch policy loss

    L = AGGREGATION_loss_type( clipped_surrogate(r, A) + beta * KL_estimator(logprobs, ref_logprobs) )

with the step hooks of :func:`agentrl.policy_loss` applied to the surrogate. An algorithm supplies
the advantages, the number of epochs and, where it differs, which KL estimator (if any) goes into
the loss (:meth:`ClippedPolicy.kl_in_loss`). Shape letters: n rows of a micro-batch, T tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import torch
from pydantic import Field

from agentrl.algorithms.base import Algorithm, LossContext
from agentrl.algorithms.objectives import AGGREGATIONS, IMPORTANCE_LEVELS, KL_ESTIMATORS, masked, policy_loss
from agentrl.config.checks import ConfigCheck
from agentrl.config.rules import Allowed, OneOf


@dataclass(frozen=True)
class ClippedPolicyConfig:
    """The ``algorithm:`` options every clipped-policy algorithm shares (subclass it)."""

    epsilon_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Lower clip range of the policy ratio: clipped at ``1 - epsilon_low``. In [0, 1)."""
    epsilon_high: Annotated[float, Field(ge=0)] = 0.2
    """Upper clip range of the policy ratio: clipped at ``1 + epsilon_high`` (> epsilon_low: DAPO's
    clip-higher). >= 0."""
    delta: Annotated[float, Allowed("expected None or a number > 1 + epsilon_high")] | None = None
    """Two-sided clipping (INTELLECT-2): cap on the unclipped ratio, > 1 + epsilon_high; None: off."""
    beta: Annotated[float, Field(ge=0)] = 0.0
    """KL coefficient to a frozen reference policy; > 0 loads a frozen reference model. >= 0."""
    kl_estimator: Annotated[str, OneOf(*KL_ESTIMATORS)] | None = None
    """KL estimator in the loss: "k1", "k2" (reverse-KL gradient on-policy) or "k3" (DeepSeekMath)."""
    loss_type: Annotated[str, OneOf(*AGGREGATIONS)] = "dapo"
    """Aggregation: "dapo" (rollout tokens), "bnpo" (step tokens), "grpo" (per-sequence mean), "dr_grpo"."""
    importance_sampling_level: Annotated[str, OneOf(*IMPORTANCE_LEVELS)] = "token"
    """Importance ratio: "token" (GRPO, PPO), "sequence" (GSPO: the length-normalised sequence ratio,
    clipped per sequence) or "sequence_token" (GSPO-token: that ratio, gradient per token)."""
    mini_batches: Annotated[int, Field(ge=1)] = 1
    """Optimizer steps per pass: the rollout batch's episodes are split into this many parts
    (TRL's steps_per_generation); > 1 makes the clipping matter. >= 1."""
    ref_sync_every: Annotated[int, Field(ge=0)] = 0
    """Iterative GRPO: after every this many steps the reference moves to the policy
    (:mod:`agentrl.algorithms.reference`); needs ``beta > 0``, not with LoRA. 0: never (a fixed reference)."""
    ref_sync_mix: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """At a reset, ``ref <- ref_sync_mix * ref + (1 - ref_sync_mix) * policy``; 0: a copy. In [0, 1)."""

    kl_estimator_required: ClassVar[bool] = False
    """True where ``kl_estimator`` has no None (the algorithm's own default) to fall back on."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        self.validate(ConfigCheck(self, "algorithm"))

    def validate(self, check: ConfigCheck) -> None:
        """Check the shared options; a subclass extends it, calling this first."""
        check.declared()
        high = 1 + self.epsilon_high  # delta's bound depends on epsilon_high
        if self.delta is not None and not self.delta > high:
            check.fail("delta", f"expected None or a number > 1 + epsilon_high = {high}")
        if self.ref_sync_every and not self.beta > 0:
            check.fail("ref_sync_every", "a reference reset needs a reference: set beta > 0, or ref_sync_every 0")


class ClippedPolicy(Algorithm):
    """Base of the clipped-policy algorithms (module docstring): a reference policy when
    ``beta > 0``, ``mini_batches`` optimizer steps per pass, and :meth:`clipped_policy_loss`."""

    config: ClippedPolicyConfig

    @property
    def needs_reference(self) -> bool:
        """A reference policy is loaded only for the KL term (``beta > 0``)."""
        return self.config.beta > 0

    @property
    def num_mini_batches(self) -> int:
        """Optimizer steps per pass (``config.mini_batches``)."""
        return self.config.mini_batches

    @property
    def reference_reset(self) -> tuple[int, float]:
        """``(ref_sync_every, ref_sync_mix)`` (:mod:`agentrl.algorithms.reference`)."""
        return self.config.ref_sync_every, self.config.ref_sync_mix

    def kl_in_loss(self) -> str | None:
        """The KL estimator of the loss's ``beta x KL`` term, None for no term: ``kl_estimator``
        when ``beta > 0``."""
        return self.config.kl_estimator if self.config.beta > 0 else None

    def clipped_policy_loss(self, context: LossContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This micro-batch's policy loss (a scalar, aggregated by ``loss_type``) and its token stats
        ``clip/low``, ``clip/high``, ``clip/region`` (``clip/delta``, ``kl`` when enabled)."""
        batch, logprobs, config = context.batch, context.logprobs, self.config
        name = type(self).__name__
        if "advantages" not in batch.extras:
            raise KeyError(f"{name}.loss needs batch.extras['advantages'] (from compute_advantages)")
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
        kl_estimator = self.kl_in_loss()
        if kl_estimator is not None:
            if context.ref_logprobs is None:
                raise ValueError(f"{name} with beta > 0 needs ref_logprobs: the trainer must load a reference")
            mask = batch.loss_mask
            estimator = KL_ESTIMATORS[kl_estimator]
            kl = estimator(masked(logprobs, mask), masked(context.ref_logprobs.detach(), mask))  # (n, T)
            per_token_loss = per_token_loss + config.beta * kl
            token_stats["kl"] = kl.detach()
        return AGGREGATIONS[config.loss_type](per_token_loss, batch.loss_mask, context.totals), token_stats
