"""The learning phase of a step: from a scored batch to new weights.

:class:`Learner` computes the frozen logprobs the algorithm needs (the sampling policy's, the
reference's), the advantages, then for each epoch and mini-batch one optimizer step of every
trained module: loss denominators over the mini-batch first, every micro-batch's loss
backpropagated (accumulated), gradients clipped, a step skipped when not finite. It knows nothing
of tasks or envs: it takes what the rollout phase collected, and gives the weights it trained as
the engine samples them (:meth:`Learner.sampling_model`) to whoever hands them over
(:mod:`agentrl.training.batches`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from pathlib import Path
from typing import Any

import torch

from agentrl.algorithms import reference
from agentrl.algorithms.base import LossContext
from agentrl.algorithms.objectives import step_totals
from agentrl.model import distributed, lora, sharding
from agentrl.model.policy import TokenLogprobs
from agentrl.rewards.unscored import Unscored
from agentrl.rundir.episodes import due
from agentrl.training.batching import micro_batch_rows, mini_batch_rows
from agentrl.training.build import Run
from agentrl.training.step_stats import StepStats
from agentrl.training.untrained import UntrainedSteps
from agentrl.trajectory import TrainBatch


class Learner:
    """Optimizer steps of the policy and the algorithm's own modules on rollout batches."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.max_sampled = run.config.max_sampled_tokens or run.config.max_new_tokens * run.envs[0].max_turns
        """The longest completion an episode may sample (the ``max_completion_length`` of some losses)."""
        self.nonfinite_skips = 0  # optimizer steps skipped over the run
        self.skipped_in_a_row = 0  # rollout steps in a row whose update was skipped entirely
        self.untrained = UntrainedSteps()
        """This session's steps that trained nothing, and why (:mod:`agentrl.training.untrained`)."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The run's forward-pass precision (:meth:`agentrl.model.precision.Precision.autocast`)."""
        return self.run.precision.autocast(self.run.accelerator.device)

    def micro_batch_rows(self, batch: TrainBatch) -> list[list[int]]:
        """Row groups of ``batch`` within the config's micro-batch limits, as many on every
        process when the weights are sharded (:func:`agentrl.training.batching.micro_batch_rows`)."""
        run = self.run
        return micro_batch_rows(batch, run.config, run.policy_pack, sharded=run.replica is not None)

    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        """Micro-batches of similar lengths (less padding; the loss is invariant to the split)."""
        return [batch.select(rows) for rows in self.micro_batch_rows(batch)]

    def training_micro_batches(self, batch: TrainBatch) -> tuple[list[TrainBatch], list[bool]]:
        """:meth:`micro_batches` of a mini-batch to backpropagate, and for each whether its backward
        can be left out: every row adds nothing to the gradient (:meth:`Algorithm.inert_rows`).
        Where a planned micro-batch mixes such rows with others, the two kinds are planned apart
        (those first); the other rows then share micro-batches differently (their gradient to
        float rounding). Otherwise (a micro-batch a group, the default) the plan is kept as it is.
        The last keeps its backward where it is the one that all-reduces the gradients (several
        processes) or where no other micro-batch has one (the optimizer then steps on zeros, as it
        would have); none is left out under sharded weights, where every micro-batch's backward
        gathers them (a collective)."""
        run = self.run
        plan = self.micro_batch_rows(batch)
        inert = None if run.replica is not None else run.algorithm.inert_rows(batch)
        if inert is None:
            return [batch.select(rows) for rows in plan], [False] * len(plan)
        if any(len(set(inert[rows].tolist())) > 1 for rows in plan):
            plan = []
            for kind in (inert, ~inert):
                index = torch.nonzero(kind).flatten()
                plan += [index[rows].tolist() for rows in self.micro_batch_rows(batch.select(index))]
        skip = [bool(inert[rows].all()) for rows in plan]
        if skip and (run.accelerator.num_processes > 1 or all(skip)):
            skip[-1] = False
        return [batch.select(rows) for rows in plan], skip

    def sampling_model(self) -> torch.nn.Module:
        """The trained weights as the engine samples them: with LoRA a plain view holding the
        merged weights, under FSDP / ZeRO-3 the full replica gathered from the shards (every
        process calls this: a collective), else the trained model itself."""
        run = self.run
        if run.replica is not None:
            sharding.gather_into(run.accelerator, run.policy, run.replica, prefix="model.")
            return run.replica
        return lora.sampling_model(run.model)

    def mini_batch_rows(self, batch: TrainBatch, step: int, epoch: int) -> list[list[int]]:
        """The algorithm's mini-batches of ``batch`` (:func:`agentrl.training.batching.mini_batch_rows`)."""
        return mini_batch_rows(batch.num_rows, self.run.algorithm.num_mini_batches, self.run.config.seed, step, epoch)

    @torch.no_grad()
    def frozen_logprobs(self, scorer: torch.nn.Module, batch: TrainBatch, with_entropy: bool = False) -> Any:
        """Logprobs of ``scorer`` (a ``TokenLogprobs``: the policy's or the reference's) for the whole
        batch, no grad; ``with_entropy``: (logprobs, entropy)."""
        out = torch.zeros_like(batch.loss_mask)
        entropies = torch.zeros_like(batch.loss_mask)
        for rows in self.micro_batch_rows(batch):
            mb = batch.select(rows)
            with self.autocast():
                lp, entropy = scorer(mb.input_ids, mb.attention_mask, mb.loss_mask, with_entropy=with_entropy)
            out[rows, : lp.shape[1]] = lp
            if with_entropy:
                entropies[rows, : entropy.shape[1]] = entropy.float()
        return (out, entropies) if with_entropy else out

    def update(self, batch: TrainBatch, metrics: dict[str, float], step: int = 1, why: Unscored | None = None) -> bool:
        """All of the algorithm's optimizer steps on one rollout batch (``step`` is 1-based);
        returns whether they trained the policy (False when no episode was scored, or when the
        algorithm trains only its own modules this step): whether the engine needs new weights.
        ``why``: why the batch's unscored episodes were not scored (the rollout phase's
        :meth:`~agentrl.training.rollout_phase.RolloutPhase.why`; default: the counts in ``metrics``),
        named when none was."""
        run, algo = self.run, self.run.algorithm
        batch.to(run.accelerator.device)  # a batch built by a caller may still be on the CPU
        logged_before = set(metrics)
        scored = distributed.all_sum(torch.isfinite(batch.rewards).sum().double())  # over every process
        if not bool(scored > 0):  # nothing scored: no signal, only Adam momentum
            self.skip_unscored(step, metrics, why if why is not None else Unscored.from_metrics([metrics], "train/"))
            return False
        self.add_frozen_logprobs(batch, step)
        for factor in run.hook.agentrl_adjust_loss_mask(
            batch=batch, config=run.config, settings=run.settings, metrics=metrics
        ):
            batch.loss_mask = batch.loss_mask * factor.to(batch.loss_mask.device)
        batch.extras["advantages"] = algo.compute_advantages(batch, metrics)
        train_policy = algo.trains_policy(step)
        stats = StepStats()
        stepped = False
        for epoch in range(algo.num_iterations):
            for rows in self.mini_batch_rows(batch, step, epoch):
                stepped |= self.optimizer_step(batch.select(rows), step, train_policy, stats, metrics)
        self.skipped_in_a_row = 0 if stepped else self.skipped_in_a_row + 1
        self.untrained.record(step, stepped)
        # What hooks and the algorithm logged here is this process's: combined over processes.
        metrics.update(_combined_over_processes({k: v for k, v in metrics.items() if k not in logged_before}))
        metrics.update(stats.means(combine=distributed.gather_objects))
        metrics["train/nonfinite_skipped_steps"] = float(self.nonfinite_skips)
        return train_policy

    def skip_unscored(self, step: int, metrics: dict[str, float], why: Unscored) -> None:
        """Skip step ``step``'s update (no episode scored), counted, with a warning saying ``why``."""
        self.skipped_in_a_row += 1
        self.untrained.record(step, False, why)
        metrics["train/skipped_unscored_batch"] = 1.0
        detail = f" ({why.describe()})" if why.unscored else ""
        warnings.warn(
            f"step {step}: no episode of the batch has a finite reward; the update was skipped{detail}",
            RuntimeWarning,
            stacklevel=3,
        )

    def stuck(self) -> bool:
        """Whether ``max_nonfinite_steps`` steps in a row trained nothing: the run stops."""
        return self.skipped_in_a_row >= self.run.config.max_nonfinite_steps

    def stop_if_stuck(self, step: int, run_dir: Path) -> None:
        """A TrainingError after ``step`` when the run is :meth:`stuck`, naming the steps, why they
        trained nothing and what to check."""
        if self.stuck():
            raise self.untrained.stuck_error(step, self.skipped_in_a_row, self.run.config.max_nonfinite_steps, run_dir)

    def stop_if_untrained(self, first_step: int, run_dir: Path) -> None:
        """A TrainingError at the end of a run none of whose steps (from ``first_step``) trained
        (:meth:`agentrl.training.untrained.UntrainedSteps.untrained_error`): no model is saved."""
        kept = "metrics.jsonl and the last checkpoint are" if self.run.config.checkpoint_every else "metrics.jsonl is"
        error = self.untrained.untrained_error(
            first_step, run_dir, f"no model/ was saved (it would be untrained); {kept}"
        )
        if error is not None:
            raise error

    def sync_reference(self, step: int, metrics: dict[str, float]) -> None:
        """After every ``ref_sync_every``-th step (``step`` 1-based), the reference moves to the
        policy (:mod:`agentrl.algorithms.reference`; every process calls it: under FSDP the gather is a collective)."""
        every, mix = self.run.algorithm.reference_reset
        if self.run.ref_model is not None and reference.reset_due(step, every):
            reference.mix_into(self.run.ref_model, self.sampling_model(), mix)
            metrics["train/reference_reset"] = 1.0

    def add_frozen_logprobs(self, batch: TrainBatch, step: int) -> None:
        """``old_logprobs`` (the policy before this step's updates) and ``ref_logprobs`` (the
        reference's) in ``batch.extras``, when the algorithm or a plugin needs them; with
        ``log_tokens: logprobs`` on a step whose episodes are written, ``trainer_logprobs`` and
        ``trainer_entropy`` too (the episode store's per-token view, one pass giving both)."""
        run = self.run
        # The prepared policy's own module: under FSDP its hooks gather the shards (run.model's alone do not).
        policy = run.accelerator.unwrap_model(run.policy)
        if run.config.log_tokens == "logprobs" and due(run.config.log_completions_every, step):
            logprobs, entropy = self.frozen_logprobs(policy, batch, with_entropy=True)
            batch.extras["trainer_logprobs"], batch.extras["trainer_entropy"] = logprobs, entropy
        if run.needs_old_logprobs:
            known = batch.extras.get("trainer_logprobs")
            batch.extras["old_logprobs"] = known if known is not None else self.frozen_logprobs(policy, batch)
        if run.ref_model is not None:
            with lora.adapter_disabled(run.ref_model):
                reference = TokenLogprobs(run.ref_model, temperature=run.config.temperature, pack=run.policy_pack)
                batch.extras["ref_logprobs"] = self.frozen_logprobs(reference, batch)

    def optimizer_step(
        self, batch: TrainBatch, step: int, train_policy: bool, stats: StepStats, metrics: dict[str, float]
    ) -> bool:
        """One optimizer step of every trained module on ``batch`` (a mini-batch): denominators
        counted over its micro-batches first, then accumulate, clip, step; skipped if not finite
        (returns whether it stepped)."""
        run = self.run
        micro, inert = self.training_micro_batches(batch)
        step_loss = self.accumulate(micro, inert, batch, step, train_policy, stats, metrics)
        trained = {name: t for name, t in run.trained.items() if train_policy or name != "policy"}
        norms = {
            name: float(run.accelerator.clip_grad_norm_(t.parameters_of.parameters(), t.max_grad_norm or float("inf")))
            for name, t in trained.items()
        }
        step_loss = float(distributed.all_sum(torch.tensor(step_loss, dtype=torch.float64)))  # every process agrees
        finite = math.isfinite(step_loss) and all(math.isfinite(n) for n in norms.values())  # norms: global already
        for name, t in trained.items():
            prefix = "train" if name == "policy" else name
            stats.add_scalar(f"{prefix}/grad_norm", norms[name], shared=True)
            stats.add_scalar(f"{prefix}/learning_rate", float(t.scheduler.get_last_lr()[0]), shared=True)
            if finite:
                t.optimizer.step()
                t.scheduler.step()
        if not finite:
            self.nonfinite_skips += 1
            warnings.warn(
                f"step {step}: loss {step_loss} or gradient norms {norms} are not finite; "
                "the optimizer step was skipped",
                RuntimeWarning,
                stacklevel=2,
            )
        for t in trained.values():
            t.optimizer.zero_grad(set_to_none=True)
        if not train_policy:
            run.trained["policy"].optimizer.zero_grad(set_to_none=True)
        stats.end_step()
        return finite

    def accumulate(
        self,
        micro: list[TrainBatch],
        inert: list[bool],
        batch: TrainBatch,
        step: int,
        train_policy: bool,
        stats: StepStats,
        metrics: dict[str, float],
    ) -> float:
        """Backpropagate every micro-batch's loss but those ``inert`` marks (gradients all-reduced
        once, after the last); returns the summed loss of this process."""
        run = self.run
        accelerator = run.accelerator
        totals = step_totals(
            [mb.loss_mask for mb in micro],
            num_tokens_rollout=float(accelerator.reduce(batch.loss_mask.sum(), "sum")),
            max_completion_length=self.max_sampled,
            reduce=lambda t: accelerator.reduce(t, "sum"),
        )
        models = [t.module for t in run.trained.values()]
        step_loss = 0.0
        with contextlib.ExitStack() as step_stack:
            if not sharding.is_fsdp(accelerator):  # the weights stay as they are until the optimizer step
                step_stack.enter_context(run.precision.casts_kept(accelerator.device))
            for i, mb in enumerate(micro):
                backward = train_policy and not inert[i]
                step_loss += self._backward_one(
                    mb, i == len(micro) - 1, backward, models, step, train_policy, totals, stats, metrics
                )
        return step_loss

    def _backward_one(
        self,
        mb: TrainBatch,
        last: bool,
        backward: bool,
        models: list[torch.nn.Module],
        step: int,
        train_policy: bool,
        totals: Any,
        stats: StepStats,
        metrics: dict[str, float],
    ) -> float:
        """One micro-batch's forward, loss and, with ``backward``, backward (gradients all-reduced
        only with ``last``); its loss."""
        run = self.run
        accelerator = run.accelerator
        with contextlib.ExitStack() as stack:
            if not last:  # gradients are all-reduced once, after the last micro-batch
                for model in models:
                    stack.enter_context(accelerator.no_sync(model))
            with self.autocast(), torch.set_grad_enabled(backward):
                logprobs, entropy = run.policy(mb.input_ids, mb.attention_mask, mb.loss_mask)
            out = run.algorithm.loss(
                LossContext(
                    batch=mb,
                    logprobs=logprobs,
                    old_logprobs=mb.extras.get("old_logprobs", logprobs.detach()),
                    ref_logprobs=mb.extras.get("ref_logprobs"),
                    totals=totals,
                    hook=run.hook,
                    config=run.config,
                    metrics=metrics,
                    step=step,
                    train_policy=train_policy,
                    autocast=self.autocast,
                    settings=run.settings,
                )
            )
            if out.loss.requires_grad:
                # Denominators are global, so undo DDP's gradient averaging (x num_processes).
                accelerator.backward(out.loss * accelerator.num_processes)
        _record(stats, out, entropy, logprobs, mb)
        return float(out.loss.detach())


def _record(stats: StepStats, out: Any, entropy: torch.Tensor, logprobs: torch.Tensor, mb: TrainBatch) -> None:
    """A micro-batch's loss, the algorithm's statistics, entropy and the trainer-vs-sampler gap."""
    stats.add_scalar("loss/total", float(out.loss.detach()))
    for key, value in out.scalars.items():
        stats.add_scalar(key, value)
    stats.add_tokens("policy/entropy", entropy, mb.loss_mask)
    log_r = logprobs.detach() - mb.sampler_logprobs  # (n, T) trainer vs sampler, same support
    stats.add_tokens("policy/sampler_logprob_gap", log_r.abs(), mb.loss_mask)
    stats.add_tokens("policy/sampler_kl", torch.expm1(log_r) - log_r, mb.loss_mask)  # k3 of KL(sampler||trainer)
    for key, value in out.token_stats.items():
        stats.add_tokens(key, value.detach(), mb.loss_mask)


def _combined_over_processes(values: dict[str, float]) -> dict[str, float]:
    """Each key over the processes that logged it: the smallest for a key ending in ``_min``, the
    largest for ``_max``, else the mean (the value itself in a one-process run)."""
    parts = distributed.gather_objects(values)
    if len(parts) == 1:
        return values
    combined = {}
    for key in sorted({k for part in parts for k in part}):
        logged = [p[key] for p in parts if key in p]
        reduce = min if key.endswith("_min") else max if key.endswith("_max") else None
        combined[key] = float(reduce(logged)) if reduce else sum(logged) / len(logged)
    return combined
