"""Trajectories: the token-exact record of one episode, multi-turn from the start.

A trajectory is one flat token sequence: the first prompt, then alternating spans of tokens the
model sampled (loss mask 1) and tokens the environment added (loss mask 0: tool results, user
feedback, the chat template's turn separators). Single-turn is the case with one sampled span.

Alignment convention, used everywhere: every per-token list has one entry per entry of
``token_ids``. ``sampler_logprobs[t]`` is the sampler's log-probability of ``token_ids[t]`` given
``token_ids[:t]`` (0.0 where ``loss_mask[t] == 0``). A trainer computing logprobs takes the logits
at position ``t - 1`` for token ``t``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.errors import EnvError

if TYPE_CHECKING:  # the tensors' functions import torch: Trajectory and Turn load without it
    import torch


@dataclass
class Turn:
    """One model turn inside a trajectory: where its sampled tokens are and what the env paid."""

    start: int
    """Index in ``token_ids`` of the first token the model sampled in this turn."""
    end: int
    """One past the last sampled token (the stop token, when the model emitted one)."""
    reward: float = 0.0
    """Reward the environment gave for this turn (``step``'s reward)."""
    finish_reason: str = "stop"
    """``stop`` when the model ended the turn itself, ``length`` when the per-turn cap cut it."""
    tool_calls: int = 0
    """Tool calls the environment parsed from this turn."""
    tool_errors: int = 0
    """Of those, how many failed (malformed call, unknown tool, the tool raised or timed out)."""
    policy_version: int | None = None
    """The policy version that sampled this turn (the engine's ``Generation.policy_version``);
    None: the version the step's collection started from."""
    token_versions: list[int] | None = None
    """Per sampled token of the turn (``end - start`` of them), the version that sampled it, when
    the engine changed weights within the turn (``Generation.token_versions``); None: every token
    is ``policy_version``'s."""


@dataclass
class Trajectory:
    """One episode, token-exact; produced by a rollout, consumed by rewards and algorithms."""

    token_ids: list[int]
    """Whole conversation as the policy saw it: first prompt, sampled spans, env deltas."""
    loss_mask: list[int]
    """1 on tokens the model sampled (including its stop token), 0 on prompt and env tokens."""
    sampler_logprobs: list[float]
    """Sampler's logprob of each sampled token, aligned with ``token_ids``; 0.0 elsewhere."""
    turns: list[Turn]
    """The model's turns in order; their spans are exactly where ``loss_mask`` is 1."""
    messages: list[dict[str, Any]]
    """The conversation as chat messages (what the env saw and said). Rendering them with the chat
    template gives exactly ``token_ids``, except where the model ended a turn with an
    end-of-sequence token other than the template's own end-of-turn token (e.g. Qwen2.5's
    ``<|endoftext|>``): ``token_ids`` keep that sampled token before the template's closing text."""
    task: dict[str, Any]
    """The task this episode solved (question, answer and any other dataset columns)."""
    group: int = 0
    """Index of the task group; trajectories of one task share it (GRPO groups)."""
    terminated: bool = False
    """The environment ended the episode (success, failure, answer given)."""
    truncated: bool = False
    """A limit ended the episode (turns, tokens, per-turn cap on the last turn)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form extras from the env or rollout (the last ``info`` dict, errors, etc.)."""
    tools: list[dict[str, Any]] | None = None
    """Tool schemas the chat template rendered (``tools=``); None when the template does not
    render them (the env then describes its tools in ``messages``). Re-rendering ``messages``
    with these gives ``token_ids``, except for the sampled stop tokens noted under ``messages``."""
    segments: list[Trajectory] = field(default_factory=list)
    """Earlier segments of the same episode, each its own token-exact row: an agent program that
    rewrote its history (``openai_agent`` rollout) starts a new segment. They share this episode's
    reward and group (:func:`with_segments`); empty for every env-driven episode."""
    step_rewards: dict[int, float] | None = None
    """Weighted step rewards by token position (:mod:`agentrl.rewards.process`): scoring sets them
    when a reward function returned step rewards for the batch; None: outcome rewards only."""
    policy_versions: list[int] | None = None
    """The policy version (completed training steps) that sampled each token, -1 where the model
    did not sample; set by an asynchronous run (:mod:`agentrl.training.async_rollouts`), None otherwise
    (every token sampled by the policy being trained)."""

    @property
    def prompt_length(self) -> int:
        """Number of tokens before the first sampled token."""
        return self.turns[0].start if self.turns else len(self.token_ids)

    @property
    def env_return(self) -> float:
        """Sum of the environment's per-turn rewards (the episode return, undiscounted)."""
        return float(sum(turn.reward for turn in self.turns))

    @property
    def num_sampled_tokens(self) -> int:
        """Number of tokens the model sampled over the whole episode."""
        return int(sum(self.loss_mask))

    @property
    def num_tool_calls(self) -> int:
        """Tool calls the env parsed over the whole episode."""
        return sum(turn.tool_calls for turn in self.turns)

    @property
    def num_tool_calls_ok(self) -> int:
        """Of those, the calls that ran (not malformed, not unknown, did not raise)."""
        return sum(turn.tool_calls - turn.tool_errors for turn in self.turns)

    @property
    def completion_text(self) -> str:
        """Text of the last assistant message ('' if the model never spoke: an episode with no
        turns, even if its prompt holds worked examples with assistant messages)."""
        if not self.turns:
            return ""
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return str(message.get("content") or "")
        return ""

    def validate(self) -> None:
        """Raise EnvError if the per-token lists or the turn spans disagree with each other."""
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.sampler_logprobs) != n:
            raise EnvError(
                f"trajectory lists disagree: {n} token_ids, {len(self.loss_mask)} loss_mask, "
                f"{len(self.sampler_logprobs)} sampler_logprobs"
            )
        expected = [0] * n
        for turn in self.turns:
            if not 0 < turn.start <= turn.end <= n:
                raise EnvError(f"turn span [{turn.start}, {turn.end}) outside 1..{n}")
            for t in range(turn.start, turn.end):
                expected[t] = 1
        if expected != list(self.loss_mask):
            raise EnvError("loss_mask is not exactly the union of the turns' sampled spans")


@dataclass
class TrainBatch:
    """Trajectories padded into tensors for the trainer; right padding, shape letters below.

    N = number of trajectories, T = longest trajectory in tokens.
    Per-token tensors follow the alignment convention of this module (index t is token t).
    """

    input_ids: torch.Tensor  # (N, T) long, pad positions hold pad_token_id
    attention_mask: torch.Tensor  # (N, T) long, 1 on real tokens (never derived from token ids)
    loss_mask: torch.Tensor  # (N, T) float, 1 on sampled tokens
    sampler_logprobs: torch.Tensor  # (N, T) float32, 0 off the loss mask
    rewards: torch.Tensor  # (N,) float32, total scalar reward per trajectory (NaN = not scored)
    groups: torch.Tensor  # (N,) long, group index per trajectory
    token_rewards: torch.Tensor  # (N, T) float32, each turn's env reward x env_reward_weight on its last sampled token
    truncated: torch.Tensor  # (N,) bool
    lengths: torch.Tensor  # (N,) long, real tokens per row
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-token tensors added by algorithms/plugins (old/ref logprobs, advantages, values)."""

    @property
    def num_rows(self) -> int:
        """N, the number of trajectories."""
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TrainBatch:
        """Move every tensor (extras too) to ``device`` in place; returns ``self``.

        ``collate`` builds CPU tensors; the trainer moves them to the policy's device.
        """
        import torch

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                setattr(self, f.name, value.to(device))
        self.extras = {key: value.to(device) for key, value in self.extras.items()}
        return self

    def select(self, rows: torch.Tensor | list[int]) -> TrainBatch:
        """Rows ``rows`` of every tensor, trimmed to the longest selected row (a micro-batch)."""
        import torch

        index = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[index].max().item()) if len(index) else 0

        def take(t: torch.Tensor) -> torch.Tensor:
            out = t[index]
            return out[:, :width] if out.dim() == 2 else out

        return TrainBatch(
            input_ids=take(self.input_ids),
            attention_mask=take(self.attention_mask),
            loss_mask=take(self.loss_mask),
            sampler_logprobs=take(self.sampler_logprobs),
            rewards=take(self.rewards),
            groups=take(self.groups),
            token_rewards=take(self.token_rewards),
            truncated=take(self.truncated),
            lengths=take(self.lengths),
            extras={k: take(v) for k, v in self.extras.items()},
        )


def with_segments(
    trajectories: list[Trajectory], rewards: list[float]
) -> tuple[list[Trajectory], list[float], list[float]]:
    """The training rows of ``trajectories``: each one's earlier ``segments`` (in order, with its
    group and its reward) and then the trajectory itself, with each row's share of its episode
    (``1 / rows``: an episode counts once in group statistics). Without segments: the inputs
    unchanged, every share 1."""
    rows: list[Trajectory] = []
    totals: list[float] = []
    shares: list[float] = []
    for trajectory, reward in zip(trajectories, rewards, strict=True):
        for segment in trajectory.segments:
            segment.group = trajectory.group
        k = len(trajectory.segments) + 1
        rows += [*trajectory.segments, trajectory]
        totals += [reward] * k
        shares += [1.0 / k] * k
    return rows, totals, shares


def collate(
    trajectories: list[Trajectory],
    rewards: list[float],
    pad_token_id: int,
    env_reward_weight: float = 1.0,
    shares: list[float] | None = None,
) -> TrainBatch:
    """Pad trajectories (right padding) into a TrainBatch; ``rewards`` is one total per trajectory,
    each turn's env reward times ``env_reward_weight`` goes to ``token_rewards`` (the weight the
    totals were scored with, so the per-turn rewards add up to the env's part of the total).

    A trajectory whose reward is NaN (not scored: no reward function scored it, or a reward
    function or its env failed) gets an all-zero ``loss_mask`` row: it adds nothing to the loss,
    its KL term or the loss denominators, exactly as if it were not in the batch; the group
    statistics of the algorithms already leave NaN rewards out. When a trajectory has
    ``step_rewards``, ``extras`` holds ``step_rewards`` and ``step_ends`` ``(N, T)`` (:mod:`agentrl.rewards.process`);
    when an episode is several rows (``shares`` from :func:`with_segments`), ``episode_shares`` ``(N,)``."""
    import torch

    if len(rewards) != len(trajectories):
        raise ValueError(f"{len(rewards)} rewards for {len(trajectories)} trajectories")
    n = len(trajectories)
    width = max((len(t.token_ids) for t in trajectories), default=0)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.float32)
    sampler_logprobs = torch.zeros((n, width), dtype=torch.float32)
    token_rewards = torch.zeros((n, width), dtype=torch.float32)
    for i, traj in enumerate(trajectories):
        length = len(traj.token_ids)
        input_ids[i, :length] = torch.tensor(traj.token_ids, dtype=torch.long)
        attention_mask[i, :length] = 1
        if not math.isnan(rewards[i]):  # an unscored episode stays out of the loss
            loss_mask[i, :length] = torch.tensor(traj.loss_mask, dtype=torch.float32)
        sampler_logprobs[i, :length] = torch.tensor(traj.sampler_logprobs, dtype=torch.float32)
        for turn in traj.turns:
            if turn.end > turn.start:
                token_rewards[i, turn.end - 1] += env_reward_weight * turn.reward
    extras: dict[str, torch.Tensor] = {}
    if any(t.step_rewards is not None for t in trajectories):
        extras["step_rewards"], extras["step_ends"] = _step_tensors(trajectories, rewards, width)
    if any(t.policy_versions is not None for t in trajectories):
        extras["policy_versions"] = torch.full((n, width), -1, dtype=torch.long)
        for i, traj in enumerate(trajectories):
            if traj.policy_versions is not None:
                extras["policy_versions"][i, : len(traj.token_ids)] = torch.tensor(traj.policy_versions)
    if shares is not None and any(share != 1.0 for share in shares):
        extras["episode_shares"] = torch.tensor(shares, dtype=torch.float32)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        sampler_logprobs=sampler_logprobs,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        groups=torch.tensor([t.group for t in trajectories], dtype=torch.long),
        token_rewards=token_rewards,
        truncated=torch.tensor([t.truncated for t in trajectories], dtype=torch.bool),
        lengths=attention_mask.sum(dim=1),
        extras=extras,
    )


def _step_tensors(
    trajectories: list[Trajectory], rewards: list[float], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(step_rewards, step_ends)``, both ``(N, width)`` float32: each row's weighted step rewards
    at their positions and 1 where a step ends. A row without ``step_rewards`` (an agent episode's
    earlier segment) has its total as one step at its last sampled token; an unscored row none."""
    import torch

    values = torch.zeros((len(trajectories), width), dtype=torch.float32)
    ends = torch.zeros_like(values)
    for i, (trajectory, total) in enumerate(zip(trajectories, rewards, strict=True)):
        if math.isnan(total):
            continue
        steps = trajectory.step_rewards
        if steps is None:
            sampled = [t for t, m in enumerate(trajectory.loss_mask) if m]
            steps = {sampled[-1]: total} if sampled else {}
        for position, reward in steps.items():
            values[i, position], ends[i, position] = reward, 1.0
    return values, ends
