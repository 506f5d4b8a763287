"""GRPO: group-relative policy optimisation, with the DAPO and Dr. GRPO variants.

Objective (DeepSeekMath, arXiv 2402.03300). Each task is sampled G times (a group); episode i
gets one scalar reward R_i and every token t the model sampled in it gets the same advantage

    A_i = (R_i - mean_group(R)) / max(std(R), std_epsilon)

and the policy minimises, per optimizer step,

    L = (1 / Z) * sum_i sum_t m_it * ( -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)
                                        + beta * KL_it )

with r_it = pi_theta(token) / pi_old(token) (the importance weight; a plugin may make it
sequence-level), m the loss mask and Z set by ``loss_type`` (see :mod:`agentrl.algorithms.objectives`).

How this departs from the papers, on purpose:

* ``loss_type="dapo"`` by default (DAPO, arXiv 2503.14476): token-level sum over the whole rollout
  batch's token count, not DeepSeekMath's per-sequence mean (``"grpo"``, length-biased, offered).
  ``"dr_grpo"`` (Dr. GRPO, arXiv 2503.20783) divides by sequences x the configured
  ``max_completion_length``; ``"bnpo"`` by the optimizer step's token count.
* Clip-higher by default (DAPO): ``epsilon_high=0.28`` against ``epsilon_low=0.2``.
  ``delta`` adds two-sided clipping (INTELLECT-2, arXiv 2505.07291): the unclipped term uses
  ``min(r, delta)``, so negative-advantage tokens with runaway ratios stay bounded.
* ``beta=0`` by default (no reference model, as DAPO and Dr. GRPO); DeepSeekMath used 0.04 with
  the k3 estimator. ``kl_estimator`` picks k1/k2/k3; k3 stays the default for familiarity, but
  only k2's gradient is the reverse-KL gradient on-policy (docs/concepts/guards.md#kl-estimators).
* The std is the population std (divide by the number of scored episodes) of the group, floored
  at ``std_epsilon`` instead of ``+ eps`` (TRL uses the unbiased std plus eps). ``"batch"`` keeps
  the group mean but divides by the std of the whole batch's rewards; ``"none"`` does not scale
  (Dr. GRPO). A group whose rewards are all equal gets advantage exactly 0
  (docs/concepts/guards.md#zero-advantage-groups).
* Rewards that are NaN (a reward function returned None) are left out of the group statistics and
  their episodes get advantage 0 (docs/concepts/guards.md#unscored-episodes). An agent episode in several rows
  (segments) counts
  once in them (``batch.extras["episode_shares"]``).
* Multi-turn: an episode's advantage covers every token the model sampled in any turn; env and
  tool tokens are off the loss mask. No dynamic sampling or soft overlong penalty (DAPO);
  truncated episodes can be masked with the trainer's ``mask_truncated_completions``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentrl import GroupRelative, GroupRelativeConfig, group_advantages, hookimpl

__all__ = ["GRPO", "GRPOConfig", "group_advantages"]


@dataclass(frozen=True)
class GRPOConfig(GroupRelativeConfig):
    """The ``algorithm:`` section for ``--algo grpo`` (the options and checks of
    :class:`agentrl.GroupRelativeConfig`, GRPO's defaults)."""


class GRPO(GroupRelative):
    """GRPO / DAPO / Dr. GRPO (module docstring). ``agentrl train --algo grpo``.

    Group advantages (:func:`agentrl.group_advantages`) and the clipped-policy loss
    (:meth:`agentrl.ClippedPolicy.clipped_policy_loss`) come from the core, which GSPO shares.
    """

    config_class = GRPOConfig
    config: GRPOConfig


@hookimpl
def agentrl_register_algorithms(register: Callable[..., None]) -> None:
    """Register ``grpo``."""
    register("grpo", GRPO)
