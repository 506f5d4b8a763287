"""The engine of an asynchronous run (``async_steps``): every generation stamped with the policy
version that sampled it.

The rollout thread of an asynchronous run (:class:`agentrl.training.async_rollouts.AsyncRollouts`)
wires :attr:`VersionedEngine.before` to its own answer of which version the next ``generate`` call
samples from; with ``partial_rollouts`` that answer may first load a newer version into the engine
(what a version is and which one samples each step: :mod:`agentrl.training.async_rollouts`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agentrl.sampling.engine import Engine, Generation, SamplingParams


class VersionedEngine(Engine):
    """The engine of an asynchronous run (``engine``: the config's): each :meth:`generate` first
    asks ``before`` (the rollout thread's ``version_to_sample``) which version it samples from, which
    with ``partial`` may load a newer one, and stamps it on every Generation. ``partial`` hides the
    engine's own ``request_queue`` (continuous batching adds requests between decode steps, past
    any point where weights could change: every batch of turns then goes through ``generate``)
    unless the engine swaps weights between decode steps, its queue's included.
    Anything else is the wrapped engine's."""

    def __init__(self, engine: Engine, partial: bool = False) -> None:
        self.engine, self.partial = engine, partial
        self.before: Callable[[], int | None] | None = None
        self.swaps_mid_call = partial and getattr(engine, "swaps_between_decode_steps", False)
        if self.swaps_mid_call:  # new weights between decode steps too
            engine.before_decode_step = self._version_now

    def _version_now(self) -> int | None:
        """The version to sample from now (the rollout thread's answer; None before it is wired)."""
        return self.before() if self.before is not None else None

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """The wrapped engine's generations, stamped with the version that sampled them (that of
        their first token when the engine changed weights during the call)."""
        version = self._version_now()
        generations = self.engine.generate(prompts, sampling)
        for generation in generations:
            generation.policy_version = generation.token_versions[0] if generation.token_versions else version
        return generations

    def sync_weights(self, model: torch.nn.Module) -> None:
        """The wrapped engine's."""
        self.engine.sync_weights(model)

    @property
    def keeps_synced_model(self) -> bool:  # type: ignore[override]
        """The wrapped engine's."""
        return getattr(self.engine, "keeps_synced_model", True)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped engine's."""
        return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The wrapped engine's."""
        self.engine.load_state_dict(state)

    @property
    def display_name(self) -> str:
        """The wrapped engine's: errors name the engine the user chose."""
        return getattr(self.engine, "display_name", type(self.engine).__name__)

    @property
    def description(self) -> str:
        """The wrapped engine's."""
        return getattr(self.engine, "description", self.display_name)

    def __getattr__(self, name: str) -> Any:
        if name in ("engine", "partial", "swaps_mid_call"):
            raise AttributeError(name)
        if name == "request_queue" and self.partial and not self.swaps_mid_call:
            raise AttributeError(name)
        return getattr(self.engine, name)
