"""``agentrl.Algorithm``: what an RL algorithm plugin implements, and what the trainer gives it.

The trainer owns the loop (rollout, scoring, micro-batching, normalisation, optimizer steps);
an algorithm supplies the parts that differ between GRPO, PPO and their variants. Per rollout
batch the trainer calls, in this order:

1. ``setup(context)`` once, before the first step: build extra models (a critic) and return them
   from ``trainable_modules()`` so the trainer gives each its own optimizer, LR schedule,
   accelerate preparation, gradient clipping and a folder in the run dir;
2. the trainer stores the trainer-old logprobs (``batch.extras["old_logprobs"]``, when
   ``needs_old_logprobs`` or a plugin asks) and the reference's (``batch.extras["ref_logprobs"]``,
   when ``needs_reference``) for the whole rollout batch, without gradients, then applies the
   ``agentrl_adjust_loss_mask`` results to ``batch.loss_mask`` (the mask is final from here on);
3. ``compute_advantages(batch, metrics)`` once -> per-token advantages ``(N, T)``; anything else
   the loss needs later (old values, returns) goes into ``batch.extras`` here, so it is computed
   once, before any weight changes;
4. for each of ``num_iterations`` epochs, the rows are split into ``num_mini_batches``
   mini-batches; each is one optimizer step of every trained module, its loss denominators
   (:class:`StepTotals`) counted over its own micro-batches; ``loss(context)`` is called once per
   micro-batch with a :class:`LossContext`.

The shared clipped surrogate, KL estimators and aggregation modes are in
:mod:`agentrl.algorithms.objectives`, which calls the step hooks, so plugins such as sequence-level
importance sampling apply to every algorithm that uses them.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from agentrl.trajectory import TrainBatch

if TYPE_CHECKING:
    from agentrl.config.train import TrainConfig


@dataclass(frozen=True)
class StepTotals:
    """Loss denominators for one optimizer step, counted over all its micro-batches and all
    processes before the first backward (so gradient accumulation and DDP change nothing)."""

    num_tokens: float
    """Loss-mask tokens in this optimizer step (all micro-batches, all processes)."""
    num_sequences: float
    """Sequences with at least one loss-mask token in this optimizer step (all micro-batches,
    all processes); fully masked rows (e.g. masked truncated episodes) are not counted."""
    num_tokens_rollout: float
    """Loss-mask tokens of the rollout rows this optimizer step trains on, counted once per
    rollout batch before any per-step change (the whole rollout batch when it is one mini-batch)."""
    max_completion_length: int
    """Configured cap on sampled tokens per episode (Dr. GRPO's constant)."""


@dataclass
class LossOutput:
    """One micro-batch's loss and the per-token statistics the trainer averages for logging."""

    loss: torch.Tensor
    """Scalar; summing it over the step's micro-batches gives the step's loss. It may depend on
    the policy and on the algorithm's trainable modules: one backward reaches them all."""
    token_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    """Name -> ``(n, T)`` tensor; logged as its loss-mask-weighted mean over the step."""
    scalars: dict[str, float] = field(default_factory=dict)
    """Name -> number; summed over the step's micro-batches and logged (e.g. ``loss/value``)."""


@dataclass
class TrainableModule:
    """A model an algorithm trains beside the policy (a critic).

    The trainer builds its AdamW optimizer and LR schedule from these fields, prepares module,
    optimizer and schedule with accelerate (``module`` is replaced by the prepared object), zeroes,
    clips and steps it with every optimizer step, and saves it to ``<run_dir>/<name>/`` at the end
    (``save_pretrained`` when the module has it, else ``state_dict.pt``).
    """

    module: torch.nn.Module
    """The model; trainable parameters are those with ``requires_grad``."""
    learning_rate: float
    """AdamW peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    lr_scheduler: str = "constant"
    """``constant``, ``linear``, ``cosine`` or ``wsd`` (as ``TrainConfig.lr_scheduler``; ``wsd``
    decays over the default ``TrainConfig.lr_decay_fraction`` of the run)."""
    warmup_steps: int = 0
    """Linear warm-up, in this module's optimizer steps."""
    max_grad_norm: float | None = 1.0
    """Clip this module's gradient norm to this (None: no clipping)."""


@dataclass
class SetupContext:
    """What ``Algorithm.setup`` receives: the run's models, tools and config."""

    model: torch.nn.Module
    """The policy (a HF causal LM, fp32 master weights, not yet prepared by accelerate: ``setup`` runs
    before the policy is wrapped, so under FSDP it is still whole and a copy of it is a plain module)."""
    tokenizer: Any
    """The policy's tokenizer."""
    accelerator: Any
    """The run's ``accelerate.Accelerator`` (its ``device`` is where batches live)."""
    config: TrainConfig
    """The whole run config."""
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    """Context manager for forward passes in the run's precision (bf16 autocast or nothing)."""
    micro_batch_rows: Callable[[TrainBatch], list[list[int]]]
    """Row groups of a batch within the run's micro-batch limits (for batched no-grad forwards)."""


@dataclass
class LossContext:
    """What ``Algorithm.loss`` receives for one micro-batch."""

    batch: TrainBatch
    """The micro-batch, its ``extras`` holding what ``compute_advantages`` stored
    (``advantages`` always; ``old_logprobs``, ``ref_logprobs`` when requested)."""
    logprobs: torch.Tensor
    """``(n, T)`` current policy logprobs of the batch's tokens (with grad unless the policy is
    frozen this step), 0 off the loss mask."""
    old_logprobs: torch.Tensor
    """``(n, T)`` trainer-old logprobs: the policy that produced the data (detached)."""
    ref_logprobs: torch.Tensor | None
    """``(n, T)`` reference policy logprobs, or None when no reference is loaded."""
    totals: StepTotals
    """This optimizer step's loss denominators."""
    hook: Any
    """The pluggy hook relay (``agentrl.algorithms.objectives.policy_loss`` calls the step hooks with it)."""
    config: TrainConfig
    """The whole run config."""
    metrics: dict[str, float]
    """The step's metric dict: add namespaced keys to log them."""
    step: int
    """The training step (1-based) this rollout batch belongs to."""
    train_policy: bool = True
    """False while the policy is frozen this step (e.g. PPO's critic warm-up): leave its loss out."""
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    """Context manager for forward passes in the run's precision."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The run's plugin settings sections by name (pass them on to ``policy_loss``)."""


class Algorithm(abc.ABC):
    """Base class of algorithm plugins. Subclasses set ``config_class`` to a frozen dataclass."""

    config_class: ClassVar[type[Any]]
    min_group_size: ClassVar[int] = 1
    """Smallest ``num_generations`` the algorithm can learn from (group-relative advantages
    need 2); a smaller one is refused at start-up."""

    def __init__(self, config: Any) -> None:
        self.config = config

    @property
    def needs_reference(self) -> bool:
        """True if a frozen reference policy must be loaded (its logprobs go to ``loss``)."""
        return False

    @property
    def num_iterations(self) -> int:
        """Epochs over each rollout batch (> 1 makes the stored old logprobs differ from current)."""
        return 1

    @property
    def num_mini_batches(self) -> int:
        """Optimizer steps per epoch: the rollout batch's rows are split into this many parts."""
        return 1

    @property
    def reference_reset(self) -> tuple[int, float]:
        """``(every, mix)``: after every ``every``-th step the trainer sets the reference to
        ``mix * ref + (1 - mix) * policy`` (:mod:`agentrl.algorithms.reference`); ``(0, 0.0)``: never."""
        return 0, 0.0

    @property
    def needs_old_logprobs(self) -> bool:
        """True if the trainer must store the sampling policy's logprobs before any update
        (needed as soon as one rollout batch gives more than one optimizer step)."""
        return self.num_iterations * self.num_mini_batches > 1

    def setup(self, context: SetupContext) -> None:
        """Called once before training; algorithms with extra models (a critic) build them here."""
        return None

    def trainable_modules(self) -> dict[str, TrainableModule]:
        """Models this algorithm trains beside the policy, by name (``critic``); called once after
        ``setup``. The trainer replaces each ``module`` with its accelerate-prepared object."""
        return {}

    def trains_policy(self, step: int) -> bool:
        """Whether the policy is updated at ``step`` (1-based); False freezes it (critic warm-up)."""
        return True

    @abc.abstractmethod
    def compute_advantages(self, batch: TrainBatch, metrics: dict[str, float]) -> torch.Tensor:
        """Per-token advantages ``(N, T)`` for a whole rollout batch (0 off the loss mask)."""

    @abc.abstractmethod
    def loss(self, context: LossContext) -> LossOutput:
        """This micro-batch's share of the optimizer step's loss (see :class:`LossContext`)."""

    def inert_rows(self, batch: TrainBatch) -> torch.Tensor | None:
        """Which rows of ``batch`` (a micro-batch with its ``extras["advantages"]``) add exactly
        nothing to the gradient whatever the weights, as a bool ``(N,)`` tensor: a GRPO group whose
        rewards are all equal has advantage 0 on every token, and a loss that is advantage times a
        function of the weights has a zero gradient there. The learner runs a micro-batch made
        only of such rows without a backward (the trained weights are the same bit for bit; its
        statistics are still logged). None (the default): every row may carry gradient."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """State kept across steps other than trainable modules (e.g. an adaptive KL
        coefficient), saved in checkpoints as JSON values and tensors (no other objects); modules
        from ``trainable_modules`` are saved for you."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output on ``--resume``."""
        return None
