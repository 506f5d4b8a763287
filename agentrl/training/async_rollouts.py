"""Asynchronous rollouts (``async_steps: N``): the episodes of later steps are collected while the
current step trains, from weights at most N policy versions old.

A policy *version* counts the completed training steps of the weights (0: the initial policy;
after step t's update the policy is version t). In a synchronous run step t trains on episodes of
version t - 1. With ``async_steps = N`` step t trains on episodes sampled by version
``max(floor, t - 1 - N)`` (``floor``: the version the run started or resumed from), so one
background thread (:class:`AsyncRollouts`) can collect steps t + 1 .. t + N while step t trains.
Every episode of a step's batch comes from one version, fixed by the step number alone, never by
timing: with per-episode seeds the batches, and so a resumed run, are the same bit for bit as an
uninterrupted one (``deterministic``).

The sampler's logprobs of a stale token are those of the version that sampled it, so the
trainer's importance weights (old / sampler, the ``sampler_correction`` plugin's TIS/MIS) correct
for the staleness; ``policy_versions`` (per token) and ``async/*`` metrics record it.

The run's batches (:class:`agentrl.training.batches.AsyncBatches`) start the thread, take each
step's batch from it and hand each new version over as a copy (:meth:`AsyncRollouts.publish`);
the engine loads it when the thread needs it, between two steps' collections, and the copy is
dropped then, unless the engine samples from it (``Engine.keeps_synced_model``: ``hf`` in
float32), which then keeps that copy alone (:func:`adopt`: never a second one).
Evaluation and checkpoints need the thread idle (:meth:`AsyncRollouts.quiesce`): a checkpoint after
step t holds every batch collected for later steps (at least t + 1 .. t + N, whose versions are no
longer anywhere else).

``partial_rollouts: true`` goes further: an episode in flight when a new version is published
continues with it. The rollout's engine is a
:class:`agentrl.sampling.versioned_engine.VersionedEngine`; before each ``generate`` call (a batch
of turns) it loads the newest published version, and stamps the version on each
Generation, so every turn records the version that sampled it (``Turn.policy_version``) and its
sampler logprobs are that version's. An engine that can change weights between decode steps
(``Engine.swaps_between_decode_steps``: ``hf``, ``vllm``) is asked before every step as well, so a turn in
flight (a single-turn episode's only one) takes the new version mid-way, and records the version
of each of its tokens (``Turn.token_versions``). A collection also starts from the newest
version, never older than the bound. Fresher tokens, no idle time, but which turn gets which version depends on
timing: such a run is not reproducible bit for bit (a resume still loses no episode and trains
none twice: a checkpoint waits for the collection in flight).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.sampling.versioned_engine import VersionedEngine
from agentrl.training.weight_copies import adopt, on_meta, snapshot
from agentrl.trajectory import TrainBatch


@dataclass
class Collected:
    """One step's collected batch, waiting to be trained on."""

    step: int
    version: int
    """The policy version that sampled every episode of the batch."""
    batch: TrainBatch
    episodes: list[Any]
    """The kept trajectories (a restored batch: their group, task and messages)."""
    metrics: dict[str, float]
    rewards: list[float]
    records: list[dict[str, Any]] = field(default_factory=list)
    """The kept episodes' lines for ``completions.jsonl`` (what a checkpoint keeps of them)."""

    def to_state(self) -> dict[str, Any]:
        """JSON values and tensors (:func:`agentrl.rundir.state_files.to_json`) that :meth:`from_state` restores."""
        b = self.batch
        tensors = {name: getattr(b, name).cpu() for name in _BATCH_TENSORS}
        return {
            "step": self.step,
            "version": self.version,
            "batch": tensors,
            "extras": dict(b.extras),
            "episodes": self.records,
            "metrics": self.metrics,
            "rewards": self.rewards,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Collected:
        """The batch :meth:`to_state` stored."""
        batch = TrainBatch(**state["batch"], extras=dict(state["extras"]))
        records = [dict(e) for e in state["episodes"]]
        episodes = [_Logged(e.get("group", 0), e.get("task", {}), e.get("messages", [])) for e in records]
        return cls(
            int(state["step"]),
            int(state["version"]),
            batch,
            episodes,
            {k: float(v) for k, v in state["metrics"].items()},
            [float(r) for r in state["rewards"]],
            records,
        )


_BATCH_TENSORS = (
    "input_ids",
    "attention_mask",
    "loss_mask",
    "sampler_logprobs",
    "rewards",
    "groups",
    "token_rewards",
    "truncated",
    "lengths",
)


@dataclass
class _Logged:
    """What a restored batch keeps of an episode (its whole line is in ``Collected.records``)."""

    group: int
    task: dict[str, Any]
    messages: list[Any] = field(default_factory=list)


def version_for(step: int, async_steps: int, floor: int) -> int:
    """The policy version that samples ``step``'s episodes."""
    return max(floor, step - 1 - async_steps)


def staleness_metrics(batch: TrainBatch, learner_version: int) -> dict[str, float]:
    """``async/staleness_mean|max`` over the batch's sampled tokens (versions between the one that
    sampled a token and the one trained on it) and ``async/tokens_lag_<k>`` (share of tokens k
    versions old)."""
    versions = batch.extras.get("policy_versions")
    on = batch.loss_mask > 0
    if versions is None or not bool(on.any()):
        return {}
    lag = (learner_version - versions[on]).double()
    out = {"async/staleness_mean": float(lag.mean()), "async/staleness_max": float(lag.max())}
    for k in torch.unique(lag).tolist():
        out[f"async/tokens_lag_{int(k)}"] = float((lag == k).double().mean())
    return out


@dataclass
class Restored:
    """What a checkpoint's collected batches give a run that resumes from it (:func:`restore`)."""

    ready: list[Collected]
    """The batches still within the staleness bound, in step order."""
    next_step: int
    """The next step to collect."""
    dropped_episodes: int
    """Episodes collected but never trained on: a batch too stale now, and every one after it
    (their tasks are lost, never repeated)."""


def restore(state: dict[str, Any] | None, async_steps: int, step: int) -> Restored:
    """From a checkpoint's ``async`` state after ``step`` (None: it has none), what a run with
    ``async_steps`` (which may have changed since; 0: a synchronous run) takes over."""
    if not state:
        return Restored([], step + 1, 0)
    ready = [Collected.from_state(c) for c in state["ready"]]
    n = 0
    while n < len(ready) and ready[n].step - 1 - ready[n].version <= async_steps:
        n += 1
    dropped = sum(len(c.episodes) for c in ready[n:])
    return Restored(ready[:n], ready[n].step if n < len(ready) else int(state["next_step"]), dropped)


class AsyncRollouts:
    """A background thread collecting steps ahead of the learner (see the module docstring).

    ``collect(step, version)`` returns a :class:`Collected`; ``load(module)`` puts weights into the
    engine. ``model`` is the sampling model whose copy the engine samples from while the learner
    trains the original. ``versioned``: the rollout's :class:`VersionedEngine`, which asks this
    thread for its version from the first ``generate`` call on (wired before the thread starts).
    ``frees_copy``: ``load`` copies the weights into the engine's own storage (the engine does not
    keep the module, ``Engine.keeps_synced_model``), so the copy's tensors are freed once loaded.
    """

    def __init__(
        self,
        collect: Callable[[int, int], Any],
        load: Callable[[torch.nn.Module], None],
        model: torch.nn.Module,
        async_steps: int,
        next_step: int,
        last_step: int,
        floor: int,
        ready: list[Collected] | None = None,
        partial: bool = False,
        versioned: VersionedEngine | None = None,
        frees_copy: bool = False,
    ) -> None:
        self.collect, self.load, self.async_steps, self.partial = collect, load, async_steps, partial
        self.last_step, self.floor = last_step, floor
        self.next_step = next_step  # the next step this thread collects
        self.ready: dict[int, Collected] = {c.step: c for c in ready or []}
        self.copy = copy.deepcopy(model)  # what the engine samples from: the learner trains ``model``
        self.frees_copy = frees_copy
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.loaded = floor  # the version in the engine
        self.load(self.copy)
        if frees_copy:
            adopt(self.copy, on_meta(self.copy.state_dict(keep_vars=True)))
        self.held = False
        self.busy = False
        self.stopped = False
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        if versioned is not None:
            versioned.before = self.version_to_sample
        self.thread = threading.Thread(target=self._run, name="agentrl-async-rollouts", daemon=True)
        self.thread.start()

    # -- the thread ----------------------------------------------------------------------------------
    def _needed(self) -> int:
        return version_for(self.next_step, self.async_steps, self.floor)

    def _into_engine(self, version: int) -> None:
        """Put a published ``version`` into the engine (through the copy, which takes the snapshot's
        tensors) and drop its snapshot, and any older one: the engine holds it now (a model's worth
        of memory each; with ``frees_copy`` the copy lets go of them too)."""
        with self.cond:
            weights = self.snapshots[version]
        adopt(self.copy, weights)
        self.load(self.copy)
        if self.frees_copy:
            adopt(self.copy, on_meta(weights))
        with self.cond:
            for old in [v for v in self.snapshots if v <= version]:
                del self.snapshots[old]

    def _newest(self) -> int:
        return max([self.loaded, *self.snapshots])

    def _can_start(self) -> bool:
        needed = self._needed()
        ready = self._newest() >= needed if self.partial else needed == self.loaded or needed in self.snapshots
        return not self.held and self.next_step <= self.last_step and ready

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.stopped or self._can_start())
                if self.stopped:
                    return
                step, version = self.next_step, self._newest() if self.partial else self._needed()
                self.busy = True
            try:
                if version != self.loaded:
                    self._into_engine(version)
                self.loaded = version
                collected = self.collect(step, version)
            except BaseException as exc:  # handed to the learner, raised by take()
                with self.cond:
                    self.error, self.busy, self.stopped = exc, False, True
                    self.cond.notify_all()
                return
            with self.cond:
                self.ready[step] = collected
                self.next_step, self.busy = step + 1, False
                for old in [v for v in self.snapshots if v < self._needed()]:
                    del self.snapshots[old]
                self.cond.notify_all()

    def version_to_sample(self) -> int | None:
        """The version the engine's next ``generate`` call samples from; with ``partial`` during a
        collection the newest published one, loaded first (the engine is then the thread's alone).
        None once stopped."""
        with self.cond:
            if self.stopped:
                return None
            newest = self._newest()
            if not (self.partial and self.busy) or newest == self.loaded:
                return self.loaded
        self._into_engine(newest)
        with self.cond:
            self.loaded = newest
        return newest

    # -- the learner's side --------------------------------------------------------------------------
    def take(self, step: int) -> Collected:
        """``step``'s batch, once collected (raises what the thread raised)."""
        with self.cond:
            self.cond.wait_for(lambda: step in self.ready or self.error is not None)
            if step not in self.ready:
                raise self.error  # type: ignore[misc]
            return self.ready.pop(step)

    def hand_over(self, step: int, model: torch.nn.Module, quiesce: bool, evaluate: bool) -> None:
        """After step ``step``'s update: publish the new version; with ``quiesce`` first wait for
        the thread (evaluation, a checkpoint); with ``evaluate`` the engine then holds it."""
        if quiesce:
            self.quiesce(step)
        self.publish(step, model)
        if evaluate:
            self.engine_at(step)

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Hand over the policy ``version``: a copy of ``model``'s weights, tied ones copied once."""
        weights = snapshot(model)
        with self.cond:
            self.snapshots[version] = weights
            self.cond.notify_all()

    def quiesce(self, step: int) -> None:
        """Wait until the thread is idle, with every step that needs a version older than ``step``
        collected; it starts nothing more until :meth:`release`."""
        through = min(step + self.async_steps, self.last_step)
        with self.cond:
            self.cond.wait_for(lambda: self.error is not None or (self.next_step > through and not self.busy))
            if self.error is not None:
                raise self.error
            self.held = True

    def engine_at(self, version: int) -> None:
        """Load ``version`` (published) into the engine: evaluation at a quiesced step."""
        with self.cond:
            if not self.held or self.busy:
                raise RuntimeError("AsyncRollouts.engine_at needs the thread quiesced (quiesce() first)")
            if version != self.loaded:
                self._into_engine(version)
                self.loaded = version

    def release(self) -> None:
        """Let the thread go on after :meth:`quiesce`."""
        with self.cond:
            self.held = False
            self.cond.notify_all()

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (call quiesced): the collected batches and the next step."""
        with self.cond:
            return {"next_step": self.next_step, "ready": [self.ready[s].to_state() for s in sorted(self.ready)]}

    def close(self, wait_s: float = 5.0) -> bool:
        """Stop the thread at its next step boundary (a collection in progress runs to its end);
        returns whether it ended within ``wait_s`` (the engine is then free)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(wait_s)
        return not self.thread.is_alive()
