"""Sequence-level importance sampling (GSPO, GSPO-token) against independent float64 computations
and the gradient formula of the GSPO paper; ``--algo gspo`` end to end on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl import AGGREGATIONS, ConfigError, StepTotals, TrainBatch, importance_log_weights, policy_loss
from agentrl.config.checks import build_plugin_config
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model, parity_reward
from agentrl.training.trainer import Trainer
from agentrl_grpo import GRPOConfig
from agentrl_gspo import GSPOConfig

HOOK = load_plugins().hook


def _batch(mask: torch.Tensor) -> TrainBatch:
    n, width = mask.shape
    return TrainBatch(
        input_ids=torch.zeros(n, width, dtype=torch.long),
        attention_mask=torch.ones(n, width, dtype=torch.long),
        loss_mask=mask,
        sampler_logprobs=torch.zeros(n, width),
        rewards=torch.zeros(n),
        groups=torch.zeros(n, dtype=torch.long),
        token_rewards=torch.zeros(n, width),
        truncated=torch.zeros(n, dtype=torch.bool),
        lengths=torch.full((n,), width),
    )


def _multi_turn_mask() -> torch.Tensor:
    """Four episodes of width 9: prompt, sampled spans with env tokens (0) between turns, padding."""
    rows = ["001100111", "000111100", "011111111", "000000000"]
    return torch.tensor([[float(c) for c in row] for row in rows], dtype=torch.float64)


def _reference_gspo_loss(logprobs, old, mask, advantages, eps_low, eps_high) -> float:
    """GSPO's objective written out with Python floats: mean over sequences with tokens of
    -min(s A, clip(s) A), s = exp(mean over the sequence's sampled tokens of the log-ratio)."""
    terms = []
    for i in range(mask.shape[0]):
        tokens = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        if not tokens:
            continue
        s = math.exp(sum(float(logprobs[i, t] - old[i, t]) for t in tokens) / len(tokens))
        a = float(advantages[i])
        terms.append(-min(s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a))
    return sum(terms) / len(terms)


def test_sequence_weights_are_the_length_normalised_mean_over_sampled_tokens_only():
    mask = _multi_turn_mask()
    log_ratio = torch.randn(4, 9, dtype=torch.float64) * mask
    weights = importance_log_weights(log_ratio, mask, "sequence")
    assert weights.shape == (4, 1)
    for i, row in enumerate(["001100111", "000111100", "011111111"]):
        picked = [float(log_ratio[i, t]) for t, c in enumerate(row) if c == "1"]
        assert float(weights[i, 0]) == pytest.approx(sum(picked) / len(picked), abs=1e-12)  # a mean, never a sum
    assert float(weights[3, 0]) == 0.0  # a row without sampled tokens is finite
    # env tokens' log-ratios (nonzero but off the mask) do not enter
    noisy = log_ratio + (1 - mask) * 5.0
    torch.testing.assert_close(importance_log_weights(noisy, mask, "sequence"), weights)


@pytest.mark.parametrize("spread", [0.001, 0.3])  # inside the clip range, and mostly clipped
def test_gspo_loss_matches_a_float64_reference(spread):
    torch.manual_seed(0)
    mask = _multi_turn_mask()
    old = -torch.rand(4, 9, dtype=torch.float64) * 3
    logprobs = old + spread * torch.randn(4, 9, dtype=torch.float64)
    advantages = torch.tensor([1.5, -0.7, -1.2, 0.4], dtype=torch.float64)
    per_token, stats = policy_loss(
        batch=_batch(mask),
        logprobs=logprobs,
        old_logprobs=old,
        advantages=advantages[:, None] * mask,
        hook=HOOK,
        train_config=None,
        metrics={},
        epsilon_low=3e-4,
        epsilon_high=4e-4,
        importance_sampling_level="sequence",
    )
    totals = StepTotals(
        num_tokens=float(mask.sum()), num_sequences=3, num_tokens_rollout=float(mask.sum()), max_completion_length=9
    )
    loss = AGGREGATIONS["grpo"](per_token, mask, totals)
    assert float(loss) == pytest.approx(_reference_gspo_loss(logprobs, old, mask, advantages, 3e-4, 4e-4), rel=1e-10)
    clipped_rows = stats["clip/region"].amax(dim=1)
    if spread > 0.1:
        assert clipped_rows[:3].sum() >= 1  # a whole sequence is clipped or not
    for i in range(4):  # the clip state is one per sequence
        on = mask[i] > 0
        assert stats["clip/region"][i][on].unique().numel() <= 1


def _sequence_logprobs(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(n, T) logprob of token t given tokens < t (0 at t = 0), float64."""
    logits = model(input_ids=ids).logits.double()  # (n, T, V)
    out = torch.zeros(ids.shape, dtype=torch.float64)
    out[:, 1:] = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return out * mask


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_autograd_gradient_equals_the_gspo_paper_formula(level):
    """GSPO paper, eq. 10: grad J = E[(1/G) sum_i s_i A_i (1/|y_i|) sum_t grad log pi(y_it)] for the
    unclipped sequences; a clipped sequence contributes nothing."""
    model = build_tiny_model(64, seed=1).double()
    torch.manual_seed(3)
    ids = torch.randint(0, 64, (4, 9))
    mask = _multi_turn_mask()
    with torch.no_grad():
        old = _sequence_logprobs(model, ids, mask) + 0.02 * torch.randn(4, 9, dtype=torch.float64) * mask
    advantages = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    logprobs = _sequence_logprobs(model, ids, mask)
    per_token, _ = policy_loss(
        batch=_batch(mask),
        logprobs=logprobs,
        old_logprobs=old,
        advantages=advantages[:, None] * mask,
        hook=HOOK,
        train_config=None,
        metrics={},
        epsilon_low=0.2,
        epsilon_high=0.2,
        importance_sampling_level=level,
    )
    totals = StepTotals(
        num_tokens=float(mask.sum()), num_sequences=3, num_tokens_rollout=float(mask.sum()), max_completion_length=9
    )
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(AGGREGATIONS["grpo"](per_token, mask, totals), params)
    # The paper's formula: coefficients c_i = s_i A_i / (G |y_i|), detached; then grad of sum_t log pi.
    with torch.no_grad():
        lengths = mask.sum(1)
        s = torch.exp(((logprobs - old) * mask).sum(1) / lengths.clamp(min=1))
        assert bool(((s - 1).abs()[:3] < 0.2).all())  # every sequence inside the clip range
        coefficient = torch.where(lengths > 0, s * advantages / (3 * lengths.clamp(min=1)), torch.zeros_like(s))
    surrogate = -(coefficient[:, None] * _sequence_logprobs(model, ids, mask)).sum()
    expected = torch.autograd.grad(surrogate, params)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-8, atol=1e-12)


def test_gspo_token_with_per_token_advantages_weights_each_token_by_the_sequence_ratio():
    torch.manual_seed(1)
    mask = _multi_turn_mask()
    old = -torch.rand(4, 9, dtype=torch.float64)
    logprobs = (old + 0.05 * torch.randn(4, 9, dtype=torch.float64)).requires_grad_(True)
    advantages = torch.randn(4, 9, dtype=torch.float64) * mask
    per_token, _ = policy_loss(
        batch=_batch(mask),
        logprobs=logprobs,
        old_logprobs=old,
        advantages=advantages,
        hook=HOOK,
        train_config=None,
        metrics={},
        epsilon_low=0.5,
        epsilon_high=0.5,
        importance_sampling_level="sequence_token",
    )
    (grad,) = torch.autograd.grad(per_token.sum(), logprobs)
    s = torch.exp(((logprobs.detach() - old) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1))
    torch.testing.assert_close(per_token.detach(), -s * advantages * mask)  # value: s_i A_it
    torch.testing.assert_close(grad, -s * advantages * mask)  # d/dlogpi_it: s_i A_it, only its own token


def test_gspo_defaults_and_bad_level():
    config = GSPOConfig()
    assert (
        config.importance_sampling_level,
        config.epsilon_low,
        config.epsilon_high,
        config.loss_type,
        config.mini_batches,
    ) == ("sequence", 3e-4, 4e-4, "grpo", 4)
    assert GRPOConfig().importance_sampling_level == "token"
    with pytest.raises(ConfigError, match="algorithm.importance_sampling_level='seq' is invalid: expected one of"):
        build_plugin_config(GRPOConfig, {"importance_sampling_level": "seq"}, "algorithm")
    with pytest.raises(ConfigError, match="algorithm.mini_batches=0 is invalid: expected an integer >= 1"):
        build_plugin_config(GSPOConfig, {"mini_batches": 0}, "algorithm")


def test_gspo_trains_end_to_end_on_a_tiny_model(tiny_model_dir, tmp_path):
    config = TrainConfig(
        model=str(tiny_model_dir),
        algo="gspo",
        max_steps=2,
        prompts_per_step=2,
        num_generations=4,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        learning_rate=1e-3,
        rewards={"parity": 1.0},
    )
    manager = load_plugins()
    manager.registry.add("reward", "parity", parity_reward, plugin="test")
    trainer = Trainer(config, manager)
    assert trainer.run.needs_old_logprobs and trainer.algorithm.num_mini_batches == 4
    before = [p.detach().clone() for p in trainer.model.parameters()]
    history = trainer.train().history
    assert all(math.isfinite(m["loss/total"]) for m in history)
    assert "clip/region" in history[-1] and history[-1]["train/nonfinite_skipped_steps"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_ppo_with_gspo_token_and_masked_correction_composes(tiny_model_dir, tmp_path):
    """The sequence ratio and the sampler correction plug into PPO unchanged (bf16 sampler)."""
    config = TrainConfig(
        model=str(tiny_model_dir),
        algo="ppo",
        max_steps=1,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        rewards={"parity": 1.0},
        algorithm={"importance_sampling_level": "sequence_token", "mini_batches": 2},
        plugins={"sampler_correction": {"mode": "mis", "level": "geometric", "cap": 1.05}},
    )
    manager = load_plugins()
    manager.registry.add("reward", "parity", parity_reward, plugin="test")
    history = Trainer(config, manager).train().history
    assert math.isfinite(history[0]["loss/total"]) and "loss/value" in history[0]
    assert 0.0 <= history[0]["mismatch/frac_masked"] <= 1.0 and history[0]["mismatch/kl"] > 0
