"""PPO with a learned critic: GAE over the model's own tokens, episode or per-turn credit.

The classic RLHF recipe (Ouyang et al. 2022, arXiv 2203.02155; the PPO objective of Schulman et
al. 2017, arXiv 1707.06347; GAE of Schulman et al. 2015, arXiv 1506.02438), for multi-turn
episodes. Only the model's sampled tokens are actions: for one episode let t_1 < ... < t_K be the
positions on the loss mask (every turn's sampled tokens, in order; env and tool tokens between
turns are skipped), V_k the critic's value of the state before token t_k, r_k the reward placed
on t_k. Then, with V_{K+1} = 0 (the episode ends),

    delta_k = r_k + gamma * V_{k+1} - V_k,    A_k = delta_k + gamma * lam * A_{k+1},    R_k = A_k + V_k

so the value of the next model token bootstraps across an env/tool gap. Rewards:

* ``credit="episode"`` (default): the episode's total reward (env return x ``env_reward_weight``
  plus the reward functions) on its last sampled token;
* ``credit="turn"``: each turn's own env reward on that turn's last sampled token (its stop token;
  ``TrainBatch.token_rewards``), the reward functions' part (they score whole episodes) on the
  episode's last sampled token;
* KL in the reward (``kl_in="reward"``, ``beta > 0``): ``-beta * (old - ref)`` (k1, no gradient)
  on every sampled token, old being the trainer's logprobs of the sampling policy.

The policy minimises the clipped surrogate of :mod:`agentrl.algorithms.objectives` (step hooks included) on
the (optionally whitened) advantages, plus ``beta`` x KL when ``kl_in="loss"``; the critic
minimises ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with ``V_clip = V_old + clip(V - V_old, +-c)``
(``c = value_clip``; plain squared error when None), a token mean over the optimizer step. Policy
and critic are separate models with separate optimizers; one backward of the summed loss reaches
each with only its own gradient.

How this departs from the papers, on purpose:

* The critic is a copy of the policy's decoder plus a zero-initialised linear value head (values
  start at 0), trained from the first step (``critic_warmup_steps`` freezes the policy for the first
  steps instead). ``gamma = lam = 1`` by default (verl's defaults): with a cold critic a smaller
  ``lam`` shrinks the advantage of early tokens towards the critic's guess.
* Episodes that end by truncation are treated as terminal (no bootstrap), as in RLHF practice.
* Episodes with a NaN total reward (no reward function scored them) get advantage 0 and are left
  out of the value loss, the whitening statistics and the explained variance.
* Defaults fit a 2-core CPU: one epoch, one mini-batch per rollout batch (``ppo_epochs`` and
  ``mini_batches`` raise both; the trainer then stores old logprobs and the clipping matters).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
from pydantic import Field
from torch import nn

from agentrl import (
    Allowed,
    ClippedPolicy,
    ClippedPolicyConfig,
    ConfigCheck,
    LossContext,
    LossOutput,
    OneOf,
    SetupContext,
    TrainableModule,
    TrainBatch,
    all_sum,
    hookimpl,
    masked,
    packing_agrees,
    selected_hidden_states,
)

CREDITS = ("episode", "turn")
KL_PLACES = ("reward", "loss")


@dataclass(frozen=True)
class PPOConfig(ClippedPolicyConfig):
    """The ``algorithm:`` section for ``--algo ppo``: the clipped-policy options of
    :class:`agentrl.ClippedPolicyConfig` (clipping, ``beta``, ``loss_type``, ``importance_sampling_level``,
    ``mini_batches``) and these."""

    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    """Discount per model token (env tokens are not steps). In [0, 1]."""
    lam: Annotated[float, Field(ge=0, le=1)] = 1.0
    """GAE lambda: 1 = Monte Carlo return minus the value, 0 = one-step TD. In [0, 1]."""
    credit: Annotated[str, OneOf(*CREDITS)] = "episode"
    """Where rewards land: "episode" (the total on the last sampled token) or "turn" (each turn's
    env reward on that turn's last sampled token, reward functions on the last)."""
    critic_learning_rate: Annotated[float, Field(gt=0)] = 5e-5
    """AdamW learning rate of the critic (its own optimizer, constant after warm-up). > 0."""
    critic_lr_warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Linear warm-up of the critic's learning rate, in optimizer steps. >= 0."""
    critic_max_grad_norm: Annotated[float, Field(gt=0)] | None = 1.0
    """Clip the critic's gradient norm to this (None: no clipping). > 0."""
    critic_warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Training steps at the start that update only the critic (the policy is frozen). >= 0."""
    value_clip: Annotated[float, Field(gt=0)] | None = 0.2
    """Clip the new value to old value +- this in the value loss (None: no clipping). > 0."""
    whiten_advantages: Annotated[bool, Allowed("expected true or false")] = True
    """Shift and scale advantages to mean 0, std 1 over the rollout batch's sampled tokens."""
    ppo_epochs: Annotated[int, Field(ge=1)] = 1
    """Passes over each rollout batch. >= 1."""
    kl_in: Annotated[str, OneOf(*KL_PLACES)] = "reward"
    """"reward": -beta x k1 per sampled token in the reward (no gradient; classic RLHF); "loss":
    beta x ``kl_estimator`` in the loss. Never both."""
    kl_estimator: str | None = None
    """KL estimator in the loss: "k1", "k2" (reverse-KL gradient) or "k3"; None: k2. The reward
    always uses k1 (any other value with ``kl_in="reward"`` is refused)."""

    def validate(self, check: ConfigCheck) -> None:
        """The shared options and the declared ranges of PPO's own (the base class checks both),
        then the rules that are code."""
        super().validate(check)
        if self.kl_in == "reward" and self.kl_estimator not in (None, "k1"):
            check.fail(
                "kl_estimator",
                "KL in the reward is k1 with no gradient; set kl_in=loss to use "
                f"{self.kl_estimator} in the loss (KL in both places double-counts it)",
            )


# ---------------------------------------------------------------------------------------------
# Pure functions. Shape letters: N episodes, T tokens, K the most sampled tokens of an episode.


def token_positions(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's loss-mask positions in order, left-aligned: ``(N, K)`` indices and validity."""
    counts = (loss_mask > 0).sum(dim=1)  # (N,)
    width = int(counts.max().item()) if counts.numel() else 0
    order = torch.sort((loss_mask <= 0).to(torch.int8), dim=1, stable=True).indices[:, :width]  # (N, K)
    valid = torch.arange(width, device=loss_mask.device)[None, :] < counts[:, None]  # (N, K)
    return order, valid


def gae(
    rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns ``(N, T)`` over the loss-mask tokens only (module docstring).

    ``rewards``, ``values`` and ``loss_mask`` are ``(N, T)``; rewards off the mask are ignored and
    the value after an episode's last sampled token is 0. Computed in float64; 0 off the mask.
    """
    positions, valid = token_positions(loss_mask)  # (N, K)
    r = torch.where(valid, rewards.double().gather(1, positions), 0.0)  # (N, K)
    v = torch.where(valid, values.double().gather(1, positions), 0.0)  # (N, K)
    advantages = torch.zeros_like(r)  # (N, K)
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)  # (N,)
    next_value = torch.zeros_like(running)  # (N,)
    for k in range(r.shape[1] - 1, -1, -1):
        delta = r[:, k] + gamma * next_value - v[:, k]
        running = torch.where(valid[:, k], delta + gamma * lam * running, 0.0)
        next_value = torch.where(valid[:, k], v[:, k], 0.0)
        advantages[:, k] = running
    out_advantages = torch.zeros(loss_mask.shape, dtype=torch.float64, device=loss_mask.device)
    out_advantages.scatter_(1, positions, torch.where(valid, advantages, 0.0))
    out_returns = torch.zeros_like(out_advantages)
    out_returns.scatter_(1, positions, torch.where(valid, advantages + v, 0.0))
    on = loss_mask > 0  # invalid slots point at positions off the mask: keep those exactly 0
    return torch.where(on, out_advantages, 0.0), torch.where(on, out_returns, 0.0)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(values - mean) / max(std, eps)`` with the mean and population std over ``mask`` only
    (docs/concepts/guards.md#ppo-advantages), over every process's share of the batch in a multi-process run; 0 off
    the mask.
    Float64 inside."""
    on = mask > 0
    count = all_sum(on.sum().double()).clamp(min=1)
    x = values.double()
    mean = all_sum(torch.where(on, x, 0.0).sum()) / count
    std = (all_sum(torch.where(on, (x - mean) ** 2, 0.0).sum()) / count).sqrt()
    return torch.where(on, (x - mean) / std.clamp(min=eps), 0.0).to(values.dtype)


def batch_mean(values: torch.Tensor, on: torch.Tensor) -> float:
    """Mean of ``values`` where ``on``, over every process's share of the batch (0.0 if none)."""
    total = all_sum(torch.where(on, values.double(), 0.0).sum())
    return float(total / all_sum(on.sum().double()).clamp(min=1))


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the mask (population variances, over every process's
    share of the batch); NaN when Var(R) is 0."""
    on = mask > 0
    count = all_sum(on.sum().double())
    if not bool(count > 0):
        return float("nan")
    r, v = returns.double()[on], values.double()[on]

    def variance(x: torch.Tensor) -> torch.Tensor:
        mean = all_sum(x.sum()) / count
        return all_sum(((x - mean) ** 2).sum()) / count

    of_returns, of_errors = variance(r), variance(r - v)
    return float("nan") if of_returns == 0 else float(1 - of_errors / of_returns)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token critic loss ``0.5 * max((V - R)^2, (V_clip - R)^2)`` ``(n, T)`` and where the
    clipped term is the larger one (float 0/1, no grad); plain ``0.5 * (V - R)^2`` when
    ``clip`` is None."""
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float().detach()


def episode_rewards(batch: TrainBatch, credit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards ``(N, T)`` by ``credit`` and which rows are scored ``(N,)`` (module
    docstring). NaN totals give an all-zero row, marked unscored."""
    mask = batch.loss_mask > 0
    scored = ~torch.isnan(batch.rewards)  # (N,)
    total = torch.where(scored, batch.rewards, 0.0).to(torch.float64)  # (N,)
    positions, valid = token_positions(batch.loss_mask)
    counts = valid.sum(dim=1)  # (N,)
    last = positions.gather(1, (counts - 1).clamp(min=0)[:, None]).squeeze(1) if positions.numel() else counts  # (N,)
    rewards = torch.zeros(batch.loss_mask.shape, dtype=torch.float64, device=mask.device)
    if credit == "turn":
        per_turn = torch.where(mask, batch.token_rewards.double(), 0.0)  # (N, T) env rewards, weighted
        rewards += per_turn
        total = total - per_turn.sum(dim=1)  # the reward functions' part
    has_tokens = counts > 0
    rows = torch.arange(len(total), device=mask.device)[has_tokens]
    rewards[rows, last[has_tokens]] += total[has_tokens]
    rewards = torch.where(scored[:, None], rewards, 0.0)
    return rewards, scored


# ---------------------------------------------------------------------------------------------
# The critic.


class ValueModel(nn.Module):
    """A critic: a copy of the policy's decoder and a linear value head, zero-initialised. With
    ``pack``, rows sharing prefixes run packed as the policy's forward runs them
    (:func:`agentrl.selected_hidden_states`): a GRPO-style group's prompt is computed once."""

    def __init__(self, decoder: nn.Module, hidden_size: int, pack: bool = False) -> None:
        super().__init__()
        self.decoder = decoder
        self.head = nn.Linear(hidden_size, 1)
        self.pack = pack
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: nn.Module, pack: bool = False) -> ValueModel:
        """A critic whose decoder starts as a copy of ``policy``'s (trainable, eval mode)."""
        decoder = copy.deepcopy(policy.get_decoder())
        for p in decoder.parameters():
            p.requires_grad_(True)
        critic = cls(decoder, int(policy.config.hidden_size), pack)
        critic = critic.to(next(policy.parameters()).device).eval()  # dropout off (docs/concepts/guards.md#dropout)
        if pack and not packing_agrees(critic.decoder):
            critic.pack = False
            warnings.warn(
                "pack_sequences: the critic's packed forward differs from the padded one on this model; "
                "the critic runs padded rows",
                RuntimeWarning,
                stacklevel=2,
            )
        return critic

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        """Values ``(N, T)``: entry t is V(state before token t), from the hidden state at t - 1,
        only where ``loss_mask`` is set (0 elsewhere), float32."""
        rows, cols = (loss_mask[:, 1:] > 0).nonzero(as_tuple=True)  # state t-1 -> token t
        hidden, where = selected_hidden_states(self.decoder, input_ids, attention_mask, rows, cols, self.pack)
        picked = self.head(hidden).float().squeeze(-1)[where]  # (K,): a shared state's value once
        values = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        values = values.index_put((rows, cols + 1), picked)  # (N, T)
        if rows.numel() == 0:  # keep the graph connected for a fully masked micro-batch
            values = values + 0.0 * hidden.sum()
        return values

    def save_pretrained(self, folder: str | Path) -> None:
        """The decoder as a HF folder (``AutoModel.from_pretrained`` loads it) plus ``value_head.pt``."""
        self.decoder.save_pretrained(folder)
        torch.save(self.head.state_dict(), Path(folder) / "value_head.pt")


# ---------------------------------------------------------------------------------------------
# The algorithm.


class PPO(ClippedPolicy):
    """PPO with a learned critic (module docstring). ``agentrl train --algo ppo``."""

    config_class = PPOConfig
    config: PPOConfig

    def __init__(self, config: PPOConfig) -> None:
        super().__init__(config)
        self.critic: TrainableModule | None = None
        self.context: SetupContext | None = None

    @property
    def num_iterations(self) -> int:
        """``ppo_epochs``."""
        return self.config.ppo_epochs

    @property
    def needs_old_logprobs(self) -> bool:
        """Several optimizer steps per rollout batch, or KL in the reward (k1 of the old policy)."""
        return super().needs_old_logprobs or (self.config.beta > 0 and self.config.kl_in == "reward")

    def kl_in_loss(self) -> str | None:
        """``kl_estimator`` (None: k2) when ``beta > 0`` and ``kl_in="loss"``; else no KL in the loss."""
        config = self.config
        return (config.kl_estimator or "k2") if config.beta > 0 and config.kl_in == "loss" else None

    def setup(self, context: SetupContext) -> None:
        """Build the critic from the policy."""
        self.context = context
        self.critic = TrainableModule(
            module=ValueModel.from_policy(context.model, pack=context.config.pack_sequences),
            learning_rate=self.config.critic_learning_rate,
            warmup_steps=self.config.critic_lr_warmup_steps,
            max_grad_norm=self.config.critic_max_grad_norm,
        )

    def trainable_modules(self) -> dict[str, TrainableModule]:
        """``critic``."""
        return {"critic": self._critic()}

    def trains_policy(self, step: int) -> bool:
        """False for the first ``critic_warmup_steps`` steps."""
        return step > self.config.critic_warmup_steps

    def _critic(self) -> TrainableModule:
        if self.critic is None:
            raise RuntimeError("PPO.setup() was not called: the trainer builds the critic there")
        return self.critic

    @torch.no_grad()
    def rollout_values(self, batch: TrainBatch) -> torch.Tensor:
        """The critic's values ``(N, T)`` of a whole batch before any update (no grad)."""
        critic, context = self._critic().module, self.context
        if context is None:
            raise RuntimeError("PPO.setup() was not called")
        values = torch.zeros_like(batch.loss_mask, dtype=torch.float32)
        for rows in context.micro_batch_rows(batch):
            mb = batch.select(rows)
            with context.autocast():
                out = critic(mb.input_ids, mb.attention_mask, mb.loss_mask)
            values[rows, : out.shape[1]] = out
        return values

    def compute_advantages(self, batch: TrainBatch, metrics: dict[str, float]) -> torch.Tensor:
        """GAE advantages ``(N, T)``; stores ``values`` (old) and ``returns`` in ``batch.extras``."""
        config = self.config
        values = self.rollout_values(batch)  # (N, T)
        rewards, scored = episode_rewards(batch, config.credit)  # (N, T), (N,)
        mask = batch.loss_mask * scored[:, None].to(batch.loss_mask.dtype)  # (N, T) rows with a reward
        if config.beta > 0 and config.kl_in == "reward":
            kl = masked(batch.extras["old_logprobs"] - batch.extras["ref_logprobs"], mask).double()  # (N, T) k1
            rewards = rewards - config.beta * kl
            metrics["kl/reward_k1_mean"] = batch_mean(kl, mask > 0)
        advantages, returns = gae(rewards, values, mask, config.gamma, config.lam)  # (N, T)
        metrics["critic/explained_variance"] = explained_variance(values, returns, mask)
        on = mask > 0
        metrics["critic/values_mean"] = batch_mean(values, on)
        metrics["critic/returns_mean"] = batch_mean(returns, on)
        if config.whiten_advantages:
            advantages = whiten(advantages, mask)
        metrics["advantage/abs_mean"] = batch_mean(advantages.abs(), on)
        batch.extras["values"] = values
        batch.extras["returns"] = returns.to(torch.float32)
        batch.extras["value_mask"] = mask
        return advantages.to(batch.loss_mask.dtype)

    def loss(self, context: LossContext) -> LossOutput:
        """Policy surrogate (skipped while the policy is frozen) plus the critic's value loss."""
        batch, config, totals = context.batch, self.config, context.totals
        token_stats: dict[str, torch.Tensor] = {}
        scalars: dict[str, float] = {}
        loss = torch.zeros((), device=batch.loss_mask.device)
        if context.train_policy:
            policy, token_stats = self.clipped_policy_loss(context)
            loss = loss + policy
            scalars["loss/policy"] = float(policy.detach())
        critic = self._critic().module
        with context.autocast():
            values = critic(batch.input_ids, batch.attention_mask, batch.loss_mask)  # (n, T)
        per_token_value, clipped = value_loss(
            values, batch.extras["values"], batch.extras["returns"], config.value_clip
        )  # (n, T)
        value_mask = batch.extras["value_mask"]
        critic_loss = masked(per_token_value, value_mask).sum() / max(1.0, float(totals.num_tokens))
        token_stats["critic/value_clip_frac"] = clipped * value_mask
        scalars["loss/value"] = float(critic_loss.detach())
        return LossOutput(loss=loss + critic_loss, token_stats=token_stats, scalars=scalars)


def config_fields() -> list[str]:
    """Every ``algorithm:`` key of PPO (for docs and tests)."""
    return [f.name for f in dataclasses.fields(PPOConfig)]


@hookimpl
def agentrl_register_algorithms(register: Callable[..., None]) -> None:
    """Register ``ppo``."""
    register("ppo", PPO)
