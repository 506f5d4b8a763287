"""``agentrl.Algorithm``: what an RL algorithm plugin implements.

The trainer owns the loop (rollout, scoring, micro-batching, normalisation, optimizer steps);
an algorithm supplies the parts that differ between GRPO, PPO and their variants:

1. ``compute_advantages(batch)`` once per rollout batch -> per-token advantages ``(N, T)``.
2. ``loss(...)`` per micro-batch -> this micro-batch's share of the optimizer step's loss.

The shared clipped surrogate, KL estimators and aggregation modes are in
:mod:`agentrl.objectives`, which calls the step hooks, so plugins such as sequence-level
importance sampling apply to every algorithm that uses them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from agentrl.trajectory import TrainBatch


@dataclass(frozen=True)
class StepTotals:
    """Loss denominators for one optimizer step, counted over all its micro-batches and all
    processes before the first backward (so gradient accumulation and DDP change nothing)."""

    num_tokens: float
    """Loss-mask tokens in this optimizer step (all micro-batches, all processes)."""
    num_sequences: float
    """Sequences in this optimizer step (all micro-batches, all processes)."""
    num_tokens_rollout: float
    """Loss-mask tokens in the whole rollout batch this step's data came from."""
    max_completion_length: int
    """Configured cap on sampled tokens per episode (Dr. GRPO's constant)."""


@dataclass
class LossOutput:
    """One micro-batch's loss and the per-token statistics the trainer averages for logging."""

    loss: torch.Tensor
    """Scalar; summing it over the step's micro-batches gives the step's loss."""
    token_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    """Name -> ``(n, T)`` tensor; logged as its loss-mask-weighted mean over the step."""


class Algorithm(abc.ABC):
    """Base class of algorithm plugins. Subclasses set ``config_class`` to a frozen dataclass."""

    config_class: ClassVar[type[Any]]

    def __init__(self, config: Any) -> None:
        self.config = config

    @property
    def needs_reference(self) -> bool:
        """True if a frozen reference policy must be loaded (its logprobs go to ``loss``)."""
        return False

    @property
    def num_iterations(self) -> int:
        """Optimizer passes over each rollout batch (> 1 needs stored old logprobs)."""
        return 1

    def setup(self, context: dict[str, Any]) -> None:
        """Called once before training with the trainer's context (``model``, ``tokenizer``,
        ``accelerator``, ``train_config``); algorithms with extra models (a critic) build them here."""
        return None

    @abc.abstractmethod
    def compute_advantages(self, batch: TrainBatch, metrics: dict[str, float]) -> torch.Tensor:
        """Per-token advantages ``(N, T)`` for a whole rollout batch (0 off the loss mask)."""

    @abc.abstractmethod
    def loss(
        self,
        batch: TrainBatch,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        totals: StepTotals,
        hook: Any,
        train_config: Any,
        metrics: dict[str, float],
    ) -> LossOutput:
        """This micro-batch's share of the loss.

        ``batch`` is the micro-batch (its ``extras["advantages"]`` set); ``logprobs`` ``(n, T)``
        the current policy's (with grad), aligned with ``batch.input_ids``; ``old_logprobs`` the
        policy that produced the data (detached); ``ref_logprobs`` the reference's or None;
        ``hook`` the pluggy hook relay for the step hooks.
        """
