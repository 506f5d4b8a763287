"""GSPO: group sequence policy optimisation (Zheng et al., arXiv 2507.18071). ``--algo gspo``.

GSPO is GRPO with one importance ratio per sequence instead of per token:

    s_i = (pi_theta(y_i | x) / pi_old(y_i | x)) ** (1 / |y_i|)
        = exp( mean over the tokens t the model sampled in y_i of (log pi_theta - log pi_old) )

    L = -(1 / G) * sum_i min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)

with A_i GRPO's group-relative advantage. The length normalisation keeps ``s_i`` in the range of a
single token's ratio, so the clip ranges are two orders smaller than GRPO's (3e-4 / 4e-4 in the
paper), and a whole sequence is clipped or not. Its gradient is
``-(1/G) sum_i s_i A_i (1/|y_i|) sum_t grad log pi_theta(y_it)`` for unclipped sequences: every
token of a sequence is weighted by the same ``s_i``, not by its own ratio.

Here it is the ``grpo`` algorithm (their shared core, :class:`agentrl.GroupRelative`) with
different defaults: ``importance_sampling_level: sequence`` (the ratio lives in
:func:`agentrl.importance_log_weights`, so ``--algo grpo --set
algorithm.importance_sampling_level=sequence`` and PPO's ``sequence_token`` use the same code),
the paper's clip ranges, the per-sequence mean (``loss_type: grpo``, the paper's 1/G average of
sequence terms) and four mini-batches per rollout batch (the paper's setting: a ratio that is
always 1, with one optimizer step per batch, would make GSPO plain GRPO). In multi-turn episodes
the sequence is every token the model sampled in the episode, env and tool tokens excluded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentrl import GroupRelative, GroupRelativeConfig, hookimpl


@dataclass(frozen=True)
class GSPOConfig(GroupRelativeConfig):
    """The ``algorithm:`` section for ``--algo gspo``: GRPO's options with GSPO's defaults."""

    importance_sampling_level: str = "sequence"
    """"sequence" (GSPO), "sequence_token" (GSPO-token) or "token" (GRPO)."""
    epsilon_low: float = 3e-4
    """Lower clip range of the sequence ratio (the paper's 3e-4)."""
    epsilon_high: float = 4e-4
    """Upper clip range of the sequence ratio (the paper's 4e-4)."""
    loss_type: str = "grpo"
    """Aggregation: "grpo" (each sequence's mean, averaged over sequences: the paper's 1/G)."""
    mini_batches: int = 4
    """Optimizer steps per rollout batch (the paper's four mini-batches)."""


class GSPO(GroupRelative):
    """GRPO (the core's :class:`agentrl.GroupRelative`) with a sequence-level importance ratio
    (module docstring)."""

    config_class = GSPOConfig
    config: GSPOConfig


@hookimpl
def agentrl_register_algorithms(register: Callable[..., None]) -> None:
    """Register ``gspo``."""
    register("gspo", GSPO)
