"""Generation engines: turn token-id prompts into sampled token ids plus the sampler's logprobs.

An engine never sees text: prompts go in as token ids and completions come out as the exact ids
sampled (stop token included), so multi-turn rollouts never re-tokenize what the model wrote.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

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
    so the two compare like with like (TRAPS 28). With top_k/top_p the distribution actually
    sampled from is renormalised over the kept tokens; its logprob is ``logprobs - kept_logmass``.
    Greedy decoding (``temperature=0``) reports the temperature-1 logprob."""
    kept_logmass: list[float] | None = None
    """Per sampled id, log of the probability mass top_k/top_p kept at that step (0.0 when they
    are off); None when the engine cannot report it."""


class Engine(abc.ABC):
    """A generation engine bound to one policy; see the module docstring."""

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt (prompts are unpadded token-id lists)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights (called after each update).

        An engine sampling from the trainer's own model object has nothing to do; one with its
        own copy (``hf`` in bfloat16, vLLM) copies the weights in and resets any prefix cache.
        """
        return None
