"""Where a step's batch comes from, and where the weights go after its update: the one seam
between the training loop and its two modes.

The loop (:class:`agentrl.training.trainer.Trainer`) asks a :class:`Batches` for the batch of step
k, trains on it, hands the new weights over, and asks for the state a checkpoint keeps. Which
implementation it talks to is picked once, from the config (:func:`make_batches`):

* :class:`SyncBatches` (``async_steps: 0``): the batch is collected now, through the rollout phase,
  from the weights of the step before; an interrupt during the collection rewinds to the step's
  start. The engine receives the new weights after each update.
* :class:`AsyncBatches` (``async_steps: N``): a rollout thread collects the batches of later steps
  while a step trains (:mod:`agentrl.training.async_rollouts`); each update's weights are handed to
  that thread as a new policy version, and a checkpoint keeps the batches collected ahead.

Either way the batches alone put weights into the engine: the learner only trains them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from agentrl.model import distributed
from agentrl.sampling.engine import Engine
from agentrl.sampling.versioned_engine import VersionedEngine
from agentrl.training.async_rollouts import AsyncRollouts, Collected, restore, staleness_metrics
from agentrl.training.build import Run
from agentrl.training.interrupts import InterruptGuard
from agentrl.training.learner import Learner
from agentrl.training.rollout_phase import RolloutPhase, StepBatch


class Batches(Protocol):
    """A run's source of batches and sink of new weights. The loop calls :meth:`restore` (when it
    resumes), :meth:`start`, then per step :meth:`take`, the update, :meth:`hand_over`, the step's
    evaluation and checkpoint (:meth:`state`), :meth:`release`; and :meth:`close` at the end, or
    when the run stops early (every process calls each, in the same order)."""

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's trainer state (:meth:`agentrl.training.saving.RunCheckpoints.load`):
        the engine receives the checkpoint's weights, and the batches collected ahead are taken
        over (an asynchronous run) or dropped and counted (a synchronous one)."""

    def start(self, completed_step: int) -> None:
        """Before the first :meth:`take` of a run that has completed ``completed_step`` steps."""

    def take(self, step: int, guard: InterruptGuard) -> StepBatch:
        """The batch step ``step`` trains on, on the run's device (``guard``: the run's signals)."""

    def hand_over(self, step: int, changed: bool, hold: bool, evaluate: bool) -> None:
        """After step ``step``'s update (``changed``: it trained the policy) the new weights go to
        the sampler. ``hold``: nothing samples in the background until :meth:`release` (an
        evaluation or a checkpoint follows); ``evaluate``: the engine then samples these weights."""

    def release(self) -> None:
        """End of the step's evaluation and checkpoint: background sampling may go on."""

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint after step ``step`` keeps of the batches (merged into the trainer
        state), once nothing samples in the background; called before the rest of the state is read."""

    def close(self) -> None:
        """Stop sampling in the background, if anything does (it may be called more than once);
        the engine then holds the trained policy."""


def make_batches(run: Run, rollouts: RolloutPhase, learner: Learner) -> Batches:
    """The run's batches: :class:`AsyncBatches` with ``async_steps``, else :class:`SyncBatches`."""
    if run.config.async_steps:
        return AsyncBatches(run, rollouts, learner.sampling_model)
    return SyncBatches(rollouts, run.engine, learner.sampling_model)


class SyncBatches:
    """Batches collected when their step asks for them (``async_steps: 0``; see :class:`Batches`).

    ``weights``: the trained policy as the engine samples it
    (:meth:`agentrl.training.learner.Learner.sampling_model`)."""

    def __init__(self, rollouts: RolloutPhase, engine: Engine, weights: Callable[[], torch.nn.Module]) -> None:
        self.rollouts, self.engine, self.weights = rollouts, engine, weights

    def restore(self, state: dict[str, Any]) -> None:
        """The checkpoint's weights into the engine; batches an asynchronous run collected ahead
        are not trained on, and a note says how many episodes that drops."""
        self.engine.sync_weights(self.weights())
        if dropped := restore(state.get("async"), 0, state["step"]).dropped_episodes:
            print(f"note: {dropped} episodes the asynchronous run collected ahead are not trained on (async_steps=0)")

    def start(self, completed_step: int) -> None:
        """Nothing to start: each batch is collected by :meth:`take`."""

    def take(self, step: int, guard: InterruptGuard) -> StepBatch:
        """Step ``step``'s batch, collected now. An interrupt before it is complete (on any
        process) rewinds the task cursor and RNG states to the step's start, then propagates."""
        boundary = self.rollouts.boundary()
        try:
            taken = self.rollouts.collect(step)
            if guard.agreed():  # every process stops here together (several processes)
                raise KeyboardInterrupt
        except KeyboardInterrupt:  # nothing trained yet: rewind to the step boundary
            self.rollouts.rewind(boundary)
            raise
        return taken

    def hand_over(self, step: int, changed: bool, hold: bool, evaluate: bool) -> None:
        """The engine samples the new weights from now on (when the update trained the policy)."""
        if changed:
            self.engine.sync_weights(self.weights())

    def release(self) -> None:
        """Nothing samples in the background."""

    def state(self, step: int) -> dict[str, Any]:
        """Nothing: a synchronous run holds no batch between steps."""
        return {}

    def close(self) -> None:
        """Nothing samples in the background; the engine holds the trained policy already."""


class AsyncBatches:
    """Batches collected ahead by a rollout thread (``async_steps: N``; see :class:`Batches` and
    :mod:`agentrl.training.async_rollouts`): step t's batch was sampled by policy version
    ``max(floor, t - 1 - N)``, fixed by the step number alone.

    ``weights``: the trained policy as the engine samples it
    (:meth:`agentrl.training.learner.Learner.sampling_model`)."""

    def __init__(self, run: Run, rollouts: RolloutPhase, weights: Callable[[], torch.nn.Module]) -> None:
        self.run, self.rollouts, self.weights = run, rollouts, weights
        self.thread: AsyncRollouts | None = None
        self.resumed: dict[str, Any] | None = None
        """The checkpoint's ``async`` state when the run resumed: what :meth:`start` takes over."""
        self.dropped_episodes = 0
        """Episodes collected ahead but never trained on (too stale after a resume with a smaller bound)."""

    def restore(self, state: dict[str, Any]) -> None:
        """The checkpoint's weights into the engine; its batches collected ahead wait for :meth:`start`."""
        self.run.engine.sync_weights(self.weights())
        self.resumed = state.get("async")

    def start(self, completed_step: int) -> None:
        """Start the rollout thread: it collects the steps after ``completed_step`` (first those the
        checkpoint did not hold), from version ``completed_step`` on."""
        config, engine, rollouts = self.run.config, self.run.engine, self.rollouts

        def collect(step: int, version: int) -> Collected:
            rollouts.sampling_version = version
            taken = rollouts.collect(step)
            return Collected(step, version, taken.batch, taken.episodes, taken.metrics, taken.rewards, taken.records)

        rollouts.group = distributed.new_group()  # the thread's collectives must not meet the learner's
        restored = restore(self.resumed, config.async_steps, completed_step)
        self.dropped_episodes = restored.dropped_episodes
        self.thread = AsyncRollouts(
            collect,
            engine.sync_weights,
            self.weights(),
            config.async_steps,
            restored.next_step,
            config.max_steps,
            floor=completed_step,
            ready=restored.ready,
            partial=config.partial_rollouts,
            versioned=engine if isinstance(engine, VersionedEngine) else None,
            frees_copy=not engine.keeps_synced_model,
        )

    def take(self, step: int, guard: InterruptGuard) -> StepBatch:
        """Step ``step``'s batch from the thread, once collected (raises what the thread raised),
        with the ``async/*`` metrics: its staleness, the version that sampled it, the episodes dropped."""
        collected = self._thread().take(step)
        metrics = {
            **collected.metrics,
            **staleness_metrics(collected.batch, step - 1),
            "async/sampling_version": float(collected.version),
            "async/dropped_episodes": float(self.dropped_episodes),
        }
        batch = collected.batch.to(self.run.accelerator.device)
        return StepBatch(batch, collected.episodes, metrics, collected.rewards, collected.records)

    def hand_over(self, step: int, changed: bool, hold: bool, evaluate: bool) -> None:
        """Publish the weights after step ``step`` as version ``step`` (every step is a version,
        ``changed`` or not); with ``hold`` first wait for the thread to be idle, with ``evaluate``
        load the version into the engine. Nothing before :meth:`start`."""
        if self.thread is not None:
            self.thread.hand_over(step, self.weights(), quiesce=hold, evaluate=evaluate)

    def release(self) -> None:
        """Let the thread go on after a held :meth:`hand_over`."""
        if self.thread is not None:
            self.thread.release()

    def state(self, step: int) -> dict[str, Any]:
        """``async``: the batches collected for the steps after ``step`` and the next step to
        collect, once the thread is idle with every step that needs a version older than ``step``
        collected (nothing before :meth:`start` or after :meth:`close`)."""
        if self.thread is None:
            return {}
        self.thread.quiesce(step)
        return {"async": self.thread.state()}

    def close(self) -> None:
        """Stop the thread (a collection in progress runs to its end); once it has ended the
        engine gets the trained policy (not when it has not: a run stopping on an error, mid-collection)."""
        if self.thread is None:
            return
        idle = self.thread.close()
        self.thread = None
        if idle:
            self.run.engine.sync_weights(self.weights())

    def _thread(self) -> AsyncRollouts:
        if self.thread is None:
            raise RuntimeError("AsyncBatches.take before start(): the rollout thread collects the batches")
        return self.thread
