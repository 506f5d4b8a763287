"""Generation engines: turn token-id prompts into sampled token ids plus the sampler's logprobs.

An engine never sees text: prompts go in as token ids and completions come out as the exact ids
sampled (stop token included), so multi-turn rollouts never re-tokenize what the model wrote.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.errors import EngineError

if TYPE_CHECKING:  # only in annotations: importing the engine API does not load torch
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of completions."""

    max_new_tokens: int = 64
    """Cap on tokens sampled per prompt (a per-turn cap in multi-turn rollouts)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    seed: int | None = None
    """Seed for this batch (None: continue the engine's generator)."""
    prompt_seeds: tuple[int, ...] | None = None
    """One seed per prompt (overrides ``seed``): each completion's random draws then depend on its
    own seed only, not on which prompts share its batch, so an episode samples the same tokens
    whether it runs in a batch of 32 on one process or of 16 on each of two."""

    def validate(self) -> None:
        """Raise EngineError naming a value out of range (engines call this before sampling)."""
        if self.max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise EngineError(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")

    def seeds_for(self, num_prompts: int) -> list[int] | None:
        """One seed per prompt: ``prompt_seeds`` when given (checked against ``num_prompts``), else
        derived from the batch ``seed`` and the prompt's index; None when unseeded."""
        if self.prompt_seeds is not None:
            if len(self.prompt_seeds) != num_prompts:
                raise EngineError(
                    f"{len(self.prompt_seeds)} prompt_seeds for {num_prompts} prompts: give one per prompt"
                )
            return [int(s) % 2**63 for s in self.prompt_seeds]
        if self.seed is None:
            return None
        return [(self.seed * 1_000_003 + i) % 2**63 for i in range(num_prompts)]


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of draw ``turn`` (0-based) of one episode seeded ``seed``: ``seed`` itself
    for draw 0, else a distinct deterministic mix of both (64-bit, within any generator's range), so
    every turn of a multi-turn episode (or every call of an agent's episode) draws fresh random
    numbers; None stays None."""
    if seed is None or turn == 0:
        return seed
    return (seed * 6364136223846793005 + turn * 1442695040888963407) % (2**63 - 1)


@dataclass
class Generation:
    """One sampled completion, token-exact."""

    token_ids: list[int]
    """Ids as sampled, including the stop token when the model emitted one; no padding."""
    finish_reason: str
    """``stop`` (a stop token was sampled) or ``length`` (``max_new_tokens`` reached)."""
    logprobs: list[float]
    """Sampler's logprob of each sampled id under its *full-vocabulary* distribution at the
    sampling temperature, ``log_softmax(logits / T)``: the same support as the trainer's logprobs,
    so the two compare like with like (docs/concepts/guards.md#logprob-parity). With top_k/top_p the distribution
    actually
    sampled from is renormalised over the kept tokens; its logprob is ``logprobs - kept_logmass``.
    Greedy decoding (``temperature=0``) reports the temperature-1 logprob."""
    kept_logmass: list[float] | None = None
    """Per sampled id, log of the probability mass top_k/top_p kept at that step (0.0 when they
    are off); None when the engine cannot report it."""
    policy_version: int | None = None
    """The policy version (completed training steps) that sampled it: stamped in an asynchronous
    run (:class:`agentrl.sampling.versioned_engine.VersionedEngine`), None otherwise. When the weights changed
    during the call, the version of its first token."""
    token_versions: list[int] | None = None
    """Per sampled id, the policy version that sampled it: filled by an engine whose weights can
    change between decode steps (:attr:`Engine.before_decode_step` set); None: every id is
    ``policy_version``'s."""


class Engine(abc.ABC):
    """A generation engine bound to one policy; see the module docstring."""

    keeps_synced_model: bool = True
    """Whether the engine reads the module given to :meth:`sync_weights` after the call returns
    (samples from it, or reloads it later). False for an engine that copies the weights into
    storage of its own: the caller may then free the module's tensors (an asynchronous run does,
    saving a copy of the weights). True, the safe answer, unless the engine says otherwise."""
    swaps_between_decode_steps: bool = False
    """True for an engine that calls :attr:`before_decode_step` before every decode step and fills
    ``Generation.token_versions``: an asynchronous run with ``partial_rollouts`` then changes its
    weights in the middle of a turn, not only between turns."""
    before_decode_step: Callable[[], int | None] | None = None
    """Set on such an engine by an asynchronous run with ``partial_rollouts`` (None otherwise).
    Called before each decode step's forward pass (and before a batch's prefill), it returns the
    policy version the engine's weights hold now, having first loaded a newer published one through
    :meth:`sync_weights` (None: unknown, nothing changed). When the version differs from the one
    the step before saw, whatever the engine computed with the old weights (its KV cache) is stale:
    the next token must be sampled from the new weights alone, and recorded as that version's."""

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt (prompts are unpadded token-id lists)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights (called after each update).

        An engine sampling from the trainer's own model object has nothing to do; one with its
        own copy (``hf`` in bfloat16, vLLM) copies the weights in and resets any prefix cache.
        """
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue sampling exactly (e.g. a generator's state), as
        JSON values and tensors."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output on ``--resume``."""
        return None

    @property
    def display_name(self) -> str:
        """How error messages name this engine: its class; an engine wrapping another names that one."""
        return type(self).__name__

    @property
    def description(self) -> str:
        """How this engine samples, for the start-up banner (``sampler: ...``): its name unless it says more."""
        return self.display_name


def token_ids(value: Any) -> list[int]:
    """A config's token id field (None, an int or a list of ints) as a list."""
    return [] if value is None else [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def stop_token_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    """The ids that end a completion: the eos ids of the model's generation config and of the
    tokenizer (every engine stops on the same set)."""
    ids = set(token_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None)))
    ids |= set(token_ids(getattr(tokenizer, "eos_token_id", None)))
    if not ids:
        raise EngineError(
            "no stop token: neither the model's generation_config nor the tokenizer "
            "sets eos_token_id; set model.generation_config.eos_token_id"
        )
    return ids
