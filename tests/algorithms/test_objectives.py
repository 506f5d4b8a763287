"""agentrl.algorithms.objectives and agentrl.defaults against independent float64 arithmetic."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agentrl import StepTotals, TrainBatch, defaults, hookimpl
from agentrl.algorithms.objectives import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    clipped_surrogate,
    masked_mean,
    policy_loss,
    step_totals,
)
from agentrl.plugins import PluginManager

CONFIG = SimpleNamespace(mask_truncated_completions=False)


def manager(*plugins: object) -> PluginManager:
    """A fresh plugin manager with the core defaults and the given test plugins."""
    m = PluginManager()
    m.register_plugin(defaults, name="agentrl.defaults")
    for i, plugin in enumerate(plugins):
        m.register_plugin(plugin, name=f"test_plugin_{i}")
    return m


def ragged_mask(lengths: list[tuple[int, int]], width: int) -> torch.Tensor:
    """(n, width) float64 mask with ones on [start, end) of each row."""
    mask = torch.zeros(len(lengths), width, dtype=torch.float64)
    for i, (start, end) in enumerate(lengths):
        mask[i, start:end] = 1.0
    return mask


def make_batch(loss_mask: torch.Tensor, truncated: list[bool] | None = None) -> TrainBatch:
    """A TrainBatch around ``loss_mask`` (only the mask and the flags matter to these tests)."""
    n, width = loss_mask.shape
    return TrainBatch(
        input_ids=torch.zeros(n, width, dtype=torch.long),
        attention_mask=torch.ones(n, width, dtype=torch.long),
        loss_mask=loss_mask,
        sampler_logprobs=torch.zeros(n, width),
        rewards=torch.zeros(n),
        groups=torch.zeros(n, dtype=torch.long),
        token_rewards=torch.zeros(n, width),
        truncated=torch.tensor(truncated or [False] * n),
        lengths=torch.full((n,), width, dtype=torch.long),
    )


# ---------------------------------------------------------------------------------------------
# KL estimators


def test_kl_estimators_match_float64_reference() -> None:
    rng = np.random.default_rng(0)
    logprobs = -rng.uniform(0.01, 4.0, size=(5, 7))
    ref = -rng.uniform(0.01, 4.0, size=(5, 7))
    expected = {
        "k1": lambda lp, rf: lp - rf,
        "k2": lambda lp, rf: 0.5 * (lp - rf) ** 2,
        "k3": lambda lp, rf: math.exp(rf - lp) - (rf - lp) - 1.0,
    }
    assert set(KL_ESTIMATORS) == set(expected)
    for name, estimator in KL_ESTIMATORS.items():
        got = estimator(torch.from_numpy(logprobs), torch.from_numpy(ref)).numpy()
        for i in range(5):
            for t in range(7):
                want = expected[name](logprobs[i, t], ref[i, t])
                assert got[i, t] == pytest.approx(want, rel=1e-12, abs=1e-14)


def test_kl_estimator_gradients_on_a_categorical_policy() -> None:
    """On-policy expected gradient of each estimator, computed exactly over the support:
    k2 gives the reverse-KL gradient, k1 zero, k3 not the reverse KL (it gives the forward KL's)."""
    rng = np.random.default_rng(1)
    theta_np = rng.normal(size=6)
    ref_np = np.log(rng.dirichlet(np.ones(6)))
    pi = np.exp(theta_np - theta_np.max())
    pi /= pi.sum()
    f = np.log(pi) - ref_np
    reverse_kl_grad = pi * (f - (pi * f).sum())  # d/dtheta_j sum_a pi_a (log pi_a - log q_a)
    forward_kl_grad = pi - np.exp(ref_np)  # d/dtheta_j sum_a q_a (log q_a - log pi_a)

    grads = {}
    for name, estimator in KL_ESTIMATORS.items():
        theta = torch.tensor(theta_np, requires_grad=True)
        logpi = torch.log_softmax(theta, dim=0)
        surrogate = (logpi.exp().detach() * estimator(logpi, torch.tensor(ref_np))).sum()
        surrogate.backward()
        grads[name] = theta.grad.numpy()
    np.testing.assert_allclose(grads["k2"], reverse_kl_grad, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["k1"], np.zeros(6), atol=1e-12)
    np.testing.assert_allclose(grads["k3"], forward_kl_grad, rtol=1e-10, atol=1e-12)
    assert np.abs(grads["k3"] - reverse_kl_grad).max() > 1e-2


# ---------------------------------------------------------------------------------------------
# Clipped surrogate

# seeds/001 section 4 setup: log-ratios, advantages, eps_low 0.1, eps_high 0.2.
EXAMPLE_LOG_RATIOS = [[-0.2, 0.2, -0.5], [0.1, -0.1, 0.3]]
EXAMPLE_ADVANTAGES = [[0.5, -0.3, 0.8], [0.2, 0.1, -0.4]]
# Derived by hand: -min(r*A, clip(r, 0.9, 1.2)*A), r = exp(log-ratio). E.g. r=0.8187, A=0.5:
# -min(0.40937, 0.45) = -0.40937; r=1.2214, A=-0.3: -min(-0.36642, -0.36) = 0.36642.
EXAMPLE_EXPECTED = [[-0.4093654, 0.3664208, -0.4852245], [-0.2210342, -0.0904837, 0.5399435]]
# The seed's wrong numbers (both terms clipped): must not be what we produce.
EXAMPLE_WRONG = [[-0.45, 0.36, -0.72], [-0.221, -0.0905, 0.48]]


def test_clipped_surrogate_worked_example() -> None:
    loss, stats = clipped_surrogate(
        torch.tensor(EXAMPLE_LOG_RATIOS, dtype=torch.float64),
        torch.tensor(EXAMPLE_ADVANTAGES, dtype=torch.float64),
        epsilon_low=0.1,
        epsilon_high=0.2,
    )
    np.testing.assert_allclose(loss.numpy(), np.array(EXAMPLE_EXPECTED), atol=1e-7)
    wrong = np.abs(loss.numpy() - np.array(EXAMPLE_WRONG))
    assert wrong[0].min() > 1e-3 and wrong[1, 2] > 1e-2
    # No token of the example is on the clipped side: the pessimistic min picks r*A everywhere.
    for key in ("clip/low", "clip/high", "clip/region"):
        assert stats[key].sum().item() == 0


def test_clip_stats_mark_the_active_clipped_term() -> None:
    ratios = torch.tensor([[0.5, 0.5, 1.5, 1.5, 1.0]], dtype=torch.float64)
    advantages = torch.tensor([[-1.0, 1.0, 1.0, -1.0, 1.0]], dtype=torch.float64)
    log_weights = ratios.log().requires_grad_(True)
    loss, stats = clipped_surrogate(log_weights, advantages, epsilon_low=0.2, epsilon_high=0.28)
    # -min(rA, clip(r)A): [-min(-0.5,-0.8), -min(0.5,0.8), -min(1.5,1.28), -min(-1.5,-1.28), -1]
    np.testing.assert_allclose(loss.detach().numpy(), [[0.8, -0.5, -1.28, 1.5, -1.0]], atol=1e-12)
    assert stats["clip/low"].tolist() == [[1, 0, 0, 0, 0]]
    assert stats["clip/high"].tolist() == [[0, 0, 1, 0, 0]]
    assert stats["clip/region"].tolist() == [[1, 0, 1, 0, 0]]
    loss.sum().backward()
    # Clipped tokens carry no gradient; the others -A*r.
    np.testing.assert_allclose(log_weights.grad.numpy(), [[0.0, -0.5, 0.0, 1.5, -1.0]], atol=1e-12)


def test_two_sided_delta_clipping() -> None:
    log_weights = torch.tensor([[1.0, 1.0, 0.5]], dtype=torch.float64, requires_grad=True)  # r = e, e, 1.6487
    advantages = torch.tensor([[-1.0, 1.0, -1.0]], dtype=torch.float64)
    loss, stats = clipped_surrogate(log_weights, advantages, epsilon_low=0.2, epsilon_high=0.28, delta=2.0)
    # A<0, r=e>delta: -min(2*-1, 1.28*-1) = 2 (3-sided: e without delta); A>0: -min(2, 1.28) = -1.28;
    # A<0, r=1.6487<delta: -min(-1.6487, -1.28) = 1.6487.
    np.testing.assert_allclose(loss.detach().numpy(), [[2.0, -1.28, math.exp(0.5)]], atol=1e-12)
    assert stats["clip/delta"].tolist() == [[1, 0, 0]]
    loss.sum().backward()
    np.testing.assert_allclose(log_weights.grad.numpy(), [[0.0, 0.0, math.exp(0.5)]], atol=1e-12)
    plain, _ = clipped_surrogate(log_weights.detach(), advantages, epsilon_low=0.2, epsilon_high=0.28)
    assert plain[0, 0].item() == pytest.approx(math.e)


def test_sequence_level_weights_broadcast() -> None:
    loss, stats = clipped_surrogate(
        torch.zeros(2, 1, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64), 0.2, 0.2
    )
    assert loss.shape == (2, 4) and stats["clip/low"].shape == (2, 4)
    assert torch.equal(loss, -torch.ones(2, 4, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# Aggregation modes and step totals


def reference_aggregate(mode: str, loss: list[list[float]], mask: list[list[float]], totals: StepTotals) -> float:
    """Plain-python float64 aggregation of one micro-batch."""
    token_sum = sum(l * m for row_l, row_m in zip(loss, mask) for l, m in zip(row_l, row_m))
    if mode == "grpo":
        per_row = [sum(l * m for l, m in zip(rl, rm)) / max(1.0, sum(rm)) for rl, rm in zip(loss, mask)]
        return sum(per_row) / max(1.0, totals.num_sequences)
    if mode == "bnpo":
        return token_sum / max(1.0, totals.num_tokens)
    if mode == "dapo":
        return token_sum / max(1.0, totals.num_tokens_rollout)
    return token_sum / max(1.0, totals.num_sequences * totals.max_completion_length)


@pytest.mark.parametrize("mode", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_aggregations_match_float64_reference(mode: str) -> None:
    rng = random.Random(mode)
    width = 13
    spans = [(rng.randint(0, 5), 0) for _ in range(6)]
    spans = [(s, rng.randint(s, width)) for s, _ in spans] + [(3, 3)]  # last row fully masked
    mask = ragged_mask(spans, width)
    loss = torch.tensor([[rng.uniform(-2, 2) for _ in range(width)] for _ in spans], dtype=torch.float64)
    totals = StepTotals(num_tokens=91.0, num_sequences=17.0, num_tokens_rollout=377.0, max_completion_length=29)
    got = AGGREGATIONS[mode](loss, mask, totals).item()
    assert got == pytest.approx(reference_aggregate(mode, loss.tolist(), mask.tolist(), totals), rel=1e-12)


def test_aggregations_of_a_fully_masked_micro_batch_are_zero_and_connected() -> None:
    loss = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    totals = StepTotals(num_tokens=0.0, num_sequences=0.0, num_tokens_rollout=0.0, max_completion_length=0)
    for mode, aggregate in AGGREGATIONS.items():
        out = aggregate(loss, torch.zeros(3, 5, dtype=torch.float64), totals)
        assert out.item() == 0.0 and out.requires_grad, mode
        (grad,) = torch.autograd.grad(out, loss)
        assert torch.equal(grad, torch.zeros_like(grad)), mode


def test_step_totals_counts_and_reduces() -> None:
    masks = [ragged_mask([(0, 3), (1, 5)], 6), ragged_mask([(2, 2)], 4), ragged_mask([(0, 6)], 6)]
    totals = step_totals(masks, num_tokens_rollout=40, max_completion_length=64)
    # The row (2, 2) has no loss token: it is not a sequence of the loss.
    assert totals == StepTotals(num_tokens=13.0, num_sequences=3.0, num_tokens_rollout=40.0, max_completion_length=64)
    doubled = step_totals(masks, num_tokens_rollout=40, max_completion_length=64, reduce=lambda t: 2 * t)
    # The rollout count is global already: reduce leaves it alone.
    assert (doubled.num_tokens, doubled.num_sequences, doubled.num_tokens_rollout) == (26.0, 6.0, 40.0)
    assert step_totals([], 0, 8).num_tokens == 0.0


@pytest.mark.parametrize("mode", ["grpo", "dr_grpo"])
def test_fully_masked_rows_do_not_dilute_per_sequence_modes(mode: str) -> None:
    """A masked truncated episode (all its tokens off the loss) must leave the loss as if it were
    not in the batch: it adds no tokens, so it must not add to the sequence count either."""
    rng = random.Random(7)
    mask = ragged_mask([(0, 4), (1, 6), (2, 3)], 6)
    loss = torch.tensor([[rng.uniform(-1, 1) for _ in range(6)] for _ in range(3)], dtype=torch.float64)
    padded_mask = torch.cat([mask, torch.zeros(2, 6, dtype=mask.dtype)])  # two fully masked rows
    padded_loss = torch.cat([loss, torch.ones(2, 6, dtype=torch.float64)])
    alone = AGGREGATIONS[mode](loss, mask, step_totals([mask], float(mask.sum()), 8)).item()
    diluted = AGGREGATIONS[mode](padded_loss, padded_mask, step_totals([padded_mask], float(mask.sum()), 8)).item()
    assert diluted == pytest.approx(alone, rel=1e-12)
    per_row = [sum(l * m for l, m in zip(rl, rm)) for rl, rm in zip(loss.tolist(), mask.tolist())]
    expected = sum(r / sum(m) for r, m in zip(per_row, mask.tolist())) / 3 if mode == "grpo" else sum(per_row) / (3 * 8)
    assert alone == pytest.approx(expected, rel=1e-12)


def test_masked_mean() -> None:
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert masked_mean(values, mask).item() == pytest.approx(3.0)
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


# ---------------------------------------------------------------------------------------------
# policy_loss and the step hooks


def test_policy_loss_default_is_token_level_surrogate() -> None:
    mask = ragged_mask([(1, 4), (0, 2)], 4)
    logprobs = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() + 0.3 * torch.randn(2, 4, dtype=torch.float64)
    advantages = torch.randn(2, 4, dtype=torch.float64) * mask
    got, stats = policy_loss(
        batch=make_batch(mask),
        logprobs=logprobs,
        old_logprobs=old,
        advantages=advantages,
        hook=manager().hook,
        train_config=CONFIG,
        metrics={},
        epsilon_low=0.2,
        epsilon_high=0.28,
    )
    expected, _ = clipped_surrogate((logprobs - old) * mask, advantages, 0.2, 0.28)
    assert torch.allclose(got, expected) and set(stats) == {"clip/low", "clip/high", "clip/region"}


def test_policy_loss_hooks_override_weights_and_multiply_factors() -> None:
    class SequenceLevel:
        @hookimpl
        def agentrl_importance_weights(self, log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
            return (log_ratio * loss_mask).sum(-1, keepdim=True) / loss_mask.sum(-1, keepdim=True).clamp(min=1)

    class Factor:
        def __init__(self, value: float) -> None:
            self.value = value

        @hookimpl
        def agentrl_per_token_loss_factors(self, logprobs: torch.Tensor) -> torch.Tensor:
            return torch.full_like(logprobs, self.value).requires_grad_(True)

    class Silent:
        @hookimpl
        def agentrl_per_token_loss_factors(self, batch: TrainBatch) -> None:
            return None

    mask = ragged_mask([(0, 3), (1, 4)], 4)
    logprobs = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() - 0.05
    advantages = torch.ones(2, 4, dtype=torch.float64) * mask
    got, _ = policy_loss(
        batch=make_batch(mask),
        logprobs=logprobs,
        old_logprobs=old,
        advantages=advantages,
        hook=manager(SequenceLevel(), Factor(0.5), Factor(3.0), Silent()).hook,
        train_config=CONFIG,
        metrics={},
        epsilon_low=0.2,
        epsilon_high=0.2,
    )
    # Sequence-level log-weight is the mean log-ratio 0.05, identical on every token; factors 0.5*3.
    expected = -1.5 * math.exp(0.05) * mask
    assert torch.allclose(got.detach(), expected)


def test_garbage_off_the_mask_does_not_leak() -> None:
    mask = ragged_mask([(1, 3), (0, 0)], 4)
    logprobs = torch.tensor([[-1.0, -0.5, -0.7, -float("inf")], [float("nan")] * 4], dtype=torch.float64)
    logprobs.requires_grad_(True)
    old = torch.tensor([[float("inf"), -0.4, -0.9, 0.0], [0.0] * 4], dtype=torch.float64)
    advantages = torch.ones(2, 4, dtype=torch.float64)
    loss, _ = policy_loss(
        batch=make_batch(mask),
        logprobs=logprobs,
        old_logprobs=old,
        advantages=advantages,
        hook=manager().hook,
        train_config=CONFIG,
        metrics={},
        epsilon_low=0.2,
        epsilon_high=0.2,
    )
    totals = StepTotals(num_tokens=2, num_sequences=2, num_tokens_rollout=2, max_completion_length=4)
    for aggregate in AGGREGATIONS.values():
        out = aggregate(loss, mask, totals)
        (grad,) = torch.autograd.grad(out, logprobs, retain_graph=True)
        assert torch.isfinite(out) and torch.isfinite(grad).all() and grad[mask == 0].abs().sum() == 0


# ---------------------------------------------------------------------------------------------
# agentrl.defaults


def test_default_loss_mask_adjustment_masks_truncated_only_when_enabled() -> None:
    mask = ragged_mask([(1, 3), (0, 4), (2, 4)], 4)
    batch = make_batch(mask, truncated=[False, True, False])
    m = manager()
    assert m.hook.agentrl_adjust_loss_mask(batch=batch, config=CONFIG, settings={}, metrics={}) == []
    metrics: dict[str, float] = {}
    enabled = SimpleNamespace(mask_truncated_completions=True)
    (keep,) = m.hook.agentrl_adjust_loss_mask(batch=batch, config=enabled, settings={}, metrics=metrics)
    assert keep.shape == (3, 4) and keep.tolist() == [[1] * 4, [0] * 4, [1] * 4]
    assert metrics["mask/frac_truncated"] == pytest.approx(1 / 3)


def test_default_importance_weights_is_trylast() -> None:
    class Override:
        @hookimpl
        def agentrl_importance_weights(self, log_ratio: torch.Tensor) -> torch.Tensor:
            return log_ratio * 0

    log_ratio = torch.ones(1, 2)
    kwargs = dict(
        log_ratio=log_ratio, loss_mask=torch.ones(1, 2), level="token", config=CONFIG, settings={}, metrics={}
    )
    assert manager().hook.agentrl_importance_weights(**kwargs) is log_ratio
    assert manager(Override()).hook.agentrl_importance_weights(**kwargs).sum() == 0
    sequence = manager().hook.agentrl_importance_weights(**{**kwargs, "level": "sequence"})
    assert sequence.shape == (1, 1) and float(sequence) == 1.0
