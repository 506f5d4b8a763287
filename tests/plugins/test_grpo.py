"""The GRPO plugin: config validation, group advantages, the loss and its normalisation."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import FrozenInstanceError
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import agentrl_grpo
from agentrl import ConfigError, LossContext, TrainBatch, defaults
from agentrl.algorithms.objectives import step_totals
from agentrl.plugins import PluginManager
from agentrl.trajectory import Trajectory, collate, with_segments
from agentrl_grpo import GRPO, GRPOConfig, group_advantages

CONFIG = SimpleNamespace(mask_truncated_completions=False)
NAN = float("nan")


def hook() -> object:
    """Hook relay of a fresh plugin manager holding only the core defaults."""
    m = PluginManager()
    m.register_plugin(defaults, name="agentrl.defaults")
    return m.hook


def ctx(batch, logprobs, old, ref, totals) -> LossContext:
    """The loss context the trainer would pass for one micro-batch."""
    return LossContext(
        batch=batch,
        logprobs=logprobs,
        old_logprobs=old,
        ref_logprobs=ref,
        totals=totals,
        hook=hook(),
        config=CONFIG,
        metrics={},
        step=1,
    )


def make_batch(
    prompt: list[int], completion: list[int], rewards: list[float], groups: list[int], vocab: int = 11, seed: int = 0
) -> TrainBatch:
    """Right-padded batch: row i is prompt[i] tokens then completion[i] sampled tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([p + c for p, c in zip(prompt, completion)])
    width = int(lengths.max())
    positions = torch.arange(width)[None, :]  # (1, T)
    attention = (positions < lengths[:, None]).long()  # (N, T)
    loss_mask = ((positions >= torch.tensor(prompt)[:, None]) & (attention > 0)).float()  # (N, T)
    n = len(prompt)
    return TrainBatch(
        input_ids=torch.randint(0, vocab, (n, width), generator=gen) * attention,
        attention_mask=attention,
        loss_mask=loss_mask,
        sampler_logprobs=torch.zeros(n, width),
        rewards=torch.tensor(rewards),
        groups=torch.tensor(groups),
        token_rewards=torch.zeros(n, width),
        truncated=torch.zeros(n, dtype=torch.bool),
        lengths=lengths,
    )


# ---------------------------------------------------------------------------------------------
# Config


def test_config_defaults_and_frozen() -> None:
    config = GRPOConfig()
    assert (config.epsilon_low, config.epsilon_high, config.beta, config.loss_type) == (0.2, 0.28, 0.0, "dapo")
    with pytest.raises(FrozenInstanceError):
        config.beta = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"loss_type": "mean"},
            "algorithm.loss_type='mean' is invalid: expected one of 'bnpo', 'dapo', 'dr_grpo', 'grpo'",
        ),
        ({"beta": -0.1}, "algorithm.beta=-0.1 is invalid: expected a number >= 0"),
        ({"epsilon_low": 1.0}, "algorithm.epsilon_low=1.0 is invalid: expected a number in [0, 1)"),
        ({"epsilon_high": -0.2}, "algorithm.epsilon_high=-0.2 is invalid: expected a number >= 0"),
        ({"num_iterations": 0}, "algorithm.num_iterations=0 is invalid: expected an integer >= 1"),
        ({"kl_estimator": "k4"}, "algorithm.kl_estimator='k4' is invalid: expected one of 'k1', 'k2', 'k3'"),
        (
            {"scale_rewards": "std"},
            "algorithm.scale_rewards='std' is invalid: expected one of 'batch', 'group', 'none'",
        ),
        ({"delta": 1.1}, "algorithm.delta=1.1 is invalid: expected None or a number > 1 + epsilon_high = 1.28"),
        ({"std_epsilon": 0.0}, "algorithm.std_epsilon=0.0 is invalid: expected a number > 0"),
        ({"beta": "0.1"}, "algorithm.beta='0.1' is invalid: expected a number"),
    ],
)
def test_config_validation_names_key_value_and_allowed(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        GRPOConfig(**kwargs)


def test_algorithm_properties_and_registration() -> None:
    assert not GRPO(GRPOConfig()).needs_reference
    assert GRPO(GRPOConfig(beta=0.04)).needs_reference
    assert GRPO(GRPOConfig(num_iterations=3)).num_iterations == 3
    m = PluginManager()
    m.register_plugin(agentrl_grpo, name="grpo")
    component = m.registry.get("algorithm", "grpo")
    assert component.factory is GRPO and component.factory.config_class is GRPOConfig


def test_rows_are_inert_where_the_advantage_is_zero_and_only_without_a_kl_term() -> None:
    batch = SimpleNamespace(
        extras={"advantages": torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.0]])},
        loss_mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]),
    )
    assert GRPO(GRPOConfig()).inert_rows(batch).tolist() == [True, False, True]
    assert GRPO(GRPOConfig(beta=0.04)).inert_rows(batch) is None  # the KL term has a gradient on every row


# ---------------------------------------------------------------------------------------------
# Group advantages


def reference_advantages(rewards: list[float], groups: list[int], scale: str, eps: float) -> list[float]:
    """Plain-python float64 advantages: NaN excluded, population std, constant group -> 0."""
    scored = [r for r in rewards if not math.isnan(r)]
    batch_mean = sum(scored) / len(scored)
    batch_std = math.sqrt(sum((r - batch_mean) ** 2 for r in scored) / len(scored))
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g and not math.isnan(x)]
        if math.isnan(r) or max(members) == min(members):
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        group_std = math.sqrt(sum((x - mean) ** 2 for x in members) / len(members))
        divisor = {"group": max(group_std, eps), "batch": max(batch_std, eps), "none": 1.0}[scale]
        out.append((r - mean) / divisor)
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_float64_reference(scale: str) -> None:
    rng = np.random.default_rng(3)
    groups = [7, 7, 7, 7, 2, 2, 2, 2, 9, 9, 9, 4, 4, 4, 4, 4]
    rewards = [float(x) for x in rng.uniform(-1, 2, size=len(groups)).astype(np.float32)]
    rewards[1] = NAN  # a reward function returned None
    rewards[8:11] = [0.1, 0.1, 0.1]  # zero-std group
    got, stats = group_advantages(torch.tensor(rewards), torch.tensor(groups), scale, eps=1e-4)
    expected = reference_advantages([float(x) for x in torch.tensor(rewards).double()], groups, scale, 1e-4)
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-6, atol=1e-7)
    assert got[1].item() == 0.0 and got[8:11].tolist() == [0.0, 0.0, 0.0]
    assert stats["frac_zero_std_groups"] == 0.25 and stats["frac_nan_rewards"] == 1 / 16


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_degenerate_groups_are_exactly_zero(scale: str) -> None:
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, NAN, NAN, 0.3, NAN, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 3])
    got, stats = group_advantages(rewards, groups, scale, eps=1e-4)
    assert torch.isfinite(got).all()
    assert got[:8].tolist() == [0.0] * 8  # all-equal / single scored / all-NaN -> exactly 0
    assert got[8] > 0 > got[9]
    assert stats["frac_zero_std_groups"] == 0.75


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_an_agent_episode_split_in_segments_counts_once_in_the_group_statistics(scale: str) -> None:
    """An agent program that rewrote its history is one episode in several rows (segments, which
    share its reward): every row gets the advantage the episode has among its group's episodes."""
    episode_rewards = [1.0, 0.0, 0.0, 0.0, 0.2, NAN, 0.9, 0.5]
    episode_groups = [0, 0, 0, 0, 1, 1, 1, 1]
    rows_of = [3, 1, 1, 1, 2, 2, 1, 4]  # episode 0: three rows; with them counted thrice its group mean is 0.5
    expected = reference_advantages(episode_rewards, episode_groups, scale, 1e-4)  # one value per episode
    trajectories = []
    for _reward, group, rows in zip(episode_rewards, episode_groups, rows_of):
        episode = Trajectory([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [], [], {}, group=group)
        episode.segments = [Trajectory([1, 4], [0, 1], [0.0, -1.0], [], [], {}) for _ in range(rows - 1)]
        trajectories.append(episode)
    rows, totals, shares = with_segments(trajectories, episode_rewards)
    batch = collate(rows, totals, pad_token_id=0, shares=shares)
    got, stats = group_advantages(batch.rewards, batch.groups, scale, 1e-4, batch.extras["episode_shares"])
    per_row = [a for a, rows in zip(expected, rows_of) for _ in range(rows)]
    np.testing.assert_allclose(got.double().numpy(), per_row, rtol=1e-6, atol=1e-7)
    assert stats["frac_nan_rewards"] == pytest.approx(1 / 8)  # one episode of eight, in two rows
    metrics: dict[str, float] = {}
    advantages = GRPO(GRPOConfig(scale_rewards=scale)).compute_advantages(batch, metrics)
    torch.testing.assert_close(advantages, got.float()[:, None] * batch.loss_mask)
    unweighted, _ = group_advantages(batch.rewards, batch.groups, scale, 1e-4)
    assert not torch.allclose(unweighted, got)  # counted once per row, the group mean would differ


def test_group_std_is_population_std_floored_by_eps() -> None:
    got, _ = group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "group", eps=1e-4)
    assert got.tolist() == [1.0, -1.0]  # population std 0.5 (the unbiased std would give +-0.707)
    tiny, _ = group_advantages(torch.tensor([1e-6, 0.0]), torch.tensor([0, 0]), "group", eps=1e-4)
    assert tiny.tolist() == pytest.approx([5e-3, -5e-3])


def test_compute_advantages_broadcasts_over_the_loss_mask() -> None:
    batch = make_batch([2, 3, 1, 2], [3, 1, 4, 0], rewards=[1.0, 0.0, 2.0, 2.0], groups=[0, 0, 1, 1])
    metrics: dict[str, float] = {}
    advantages = GRPO(GRPOConfig()).compute_advantages(batch, metrics)
    assert advantages.shape == batch.loss_mask.shape
    assert torch.equal(advantages, torch.tensor([1.0, -1.0, 0.0, 0.0])[:, None] * batch.loss_mask)
    assert metrics["advantage/frac_zero_std_groups"] == 0.5
    assert set(metrics) == {"advantage/frac_zero_std_groups", "advantage/frac_nan_rewards", "advantage/abs_mean"}


# ---------------------------------------------------------------------------------------------
# The loss


def test_loss_on_the_seed_worked_example() -> None:
    """seeds/001 section 4, with only the unclipped-vs-clipped min done right (derived by hand):
    per-token losses [-0.4093654, 0.3664208, -0.4852245] and [-0.2210342, -0.0904837, 0.5399435]."""
    batch = make_batch([1, 1], [3, 3], rewards=[0.0, 0.0], groups=[0, 1])
    logprobs = torch.tensor([[0.0, -1.2, -0.8, -1.5], [0.0, -0.9, -1.1, -0.7]], dtype=torch.float64)
    old = torch.tensor([[0.0, -1.0, -1.0, -1.0], [0.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    batch.extras["advantages"] = torch.tensor([[0.0, 0.5, -0.3, 0.8], [0.0, 0.2, 0.1, -0.4]], dtype=torch.float64)
    totals = step_totals([batch.loss_mask], num_tokens_rollout=6, max_completion_length=4)
    expected = {"grpo": -0.0499572, "bnpo": -0.0499572, "dapo": -0.0499572, "dr_grpo": -0.0374679}
    for loss_type, value in expected.items():
        algo = GRPO(GRPOConfig(epsilon_low=0.1, epsilon_high=0.2, loss_type=loss_type))
        out = algo.loss(ctx(batch, logprobs, old, None, totals))
        assert out.loss.item() == pytest.approx(value, abs=1e-7), loss_type
    # The seed's own answer (both terms clipped) is -0.10675.
    assert abs(out.loss.item() - -0.10675) > 0.05


def test_kl_term_and_token_stats() -> None:
    batch = make_batch([1, 2], [3, 2], rewards=[1.0, 0.0], groups=[0, 0])
    logprobs = -torch.rand(2, 4, dtype=torch.float64)
    ref = logprobs - 0.2 * batch.loss_mask
    batch.extras["advantages"] = torch.zeros(2, 4, dtype=torch.float64)
    totals = step_totals([batch.loss_mask], num_tokens_rollout=5, max_completion_length=4)
    out = GRPO(GRPOConfig(beta=0.5, kl_estimator="k2", loss_type="bnpo")).loss(
        ctx(batch, logprobs, logprobs, ref, totals)
    )
    assert out.loss.item() == pytest.approx(0.5 * 0.5 * 0.2**2)  # zero advantage: only beta * k2
    assert set(out.token_stats) == {"kl", "clip/low", "clip/high", "clip/region"}
    assert torch.allclose(out.token_stats["kl"], 0.02 * batch.loss_mask.double())
    no_kl = GRPO(GRPOConfig()).loss(ctx(batch, logprobs, logprobs, None, totals))
    assert "kl" not in no_kl.token_stats


# Very uneven lengths; row 3 has no sampled token (its micro-batch is fully masked).
PROMPT = [2, 5, 3, 4, 2, 3, 6, 2]
COMPLETION = [1, 45, 3, 0, 30, 7, 2, 19]
ONE_MICRO_BATCH = [[list(range(8))]]
FOUR_MICRO_BATCHES = [[[0, 1], [3], [2, 4, 5], [6, 7]]]
TWO_RANKS = [[[1, 6], [3, 0]], [[2], [4, 5, 7]]]


def step(
    algo: GRPO,
    batch: TrainBatch,
    split: list[list[list[int]]],
    extra_rollout_tokens: float,
    per_micro_batch_totals: bool = False,
) -> tuple[float, torch.Tensor]:
    """One optimizer step's loss (summed over micro-batches and simulated ranks; DDP's mean of
    gradients times the world size) and its gradient wrt a leaf tensor of logits."""
    torch.manual_seed(0)
    logits = torch.randn(*batch.input_ids.shape, 11, dtype=torch.float64, requires_grad=True)  # (N, T, V)
    logprobs = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[..., None]).squeeze(-1)  # (N, T)
    noise = torch.rand(logprobs.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    old = logprobs.detach() + 0.8 * (noise - 0.5) * batch.loss_mask  # (N, T), some tokens clip
    ref = logprobs.detach() - 0.3 * noise * batch.loss_mask  # (N, T)
    rollout = float(batch.loss_mask.sum()) + extra_rollout_tokens  # global, as the trainer passes it
    local = []
    for rank in split:
        masks = [batch.select(rows).loss_mask for rows in rank]
        step_totals(masks, rollout, 64, reduce=lambda t: local.append(t) or t)
    total_loss = torch.zeros((), dtype=torch.float64)
    for k, rank in enumerate(split):
        masks = [batch.select(rows).loss_mask for rows in rank]
        others = sum(local[j] for j in range(len(split)) if j != k)
        totals = step_totals(masks, rollout, 64, reduce=lambda t, others=others: t + others)
        for rows in rank:
            micro = batch.select(rows)
            width = micro.input_ids.shape[1]
            if per_micro_batch_totals:
                totals = step_totals([micro.loss_mask], float(micro.loss_mask.sum()), 64)
            out = algo.loss(ctx(micro, logprobs[rows, :width], old[rows, :width], ref[rows, :width], totals))
            assert torch.isfinite(out.loss) and out.loss.requires_grad
            total_loss = total_loss + out.loss
    total_loss.backward()
    assert torch.isfinite(logits.grad).all()
    return total_loss.item(), logits.grad


@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_normalisation_is_invariant_to_micro_batches_and_ranks(loss_type: str, beta: float) -> None:
    batch = make_batch(PROMPT, COMPLETION, rewards=[1, 0, 0.5, 1, 0, 1, 1, 0], groups=[0, 0, 0, 0, 1, 1, 1, 1])
    algo = GRPO(GRPOConfig(loss_type=loss_type, beta=beta, kl_estimator="k3"))
    batch.extras["advantages"] = algo.compute_advantages(batch, {}).double()
    reference_loss, reference_grad = step(algo, batch, ONE_MICRO_BATCH, 100.0)
    assert reference_grad.abs().sum() > 0
    for split in (FOUR_MICRO_BATCHES, TWO_RANKS):
        loss, grad = step(algo, batch, split, 100.0)
        assert loss == pytest.approx(reference_loss, rel=1e-12)
        torch.testing.assert_close(grad, reference_grad, rtol=1e-10, atol=1e-14)


def test_per_micro_batch_token_mean_would_break_invariance() -> None:
    """Guard on the test above: the naive per-micro-batch normaliser does change the gradient."""
    batch = make_batch(PROMPT, COMPLETION, rewards=[1, 0, 0.5, 1, 0, 1, 1, 0], groups=[0, 0, 0, 0, 1, 1, 1, 1])
    algo = GRPO(GRPOConfig(loss_type="bnpo"))
    batch.extras["advantages"] = algo.compute_advantages(batch, {}).double()
    _, reference_grad = step(algo, batch, ONE_MICRO_BATCH, 0.0)
    _, naive_grad = step(algo, batch, FOUR_MICRO_BATCHES, 0.0, per_micro_batch_totals=True)
    assert (naive_grad - reference_grad).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------
# A real (tiny) causal LM: one SGD step on the GRPO loss moves the sampled completion's logprob.

TEMPERATURE = 0.7


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T) of each token given its prefix, aligned so index t is token t."""
    logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits.float()  # (N, L, V)
    logprobs = torch.log_softmax(logits[:, :-1] / TEMPERATURE, -1)  # (N, L - 1, V)
    logprobs = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (N, L - 1), token t + 1
    return torch.cat([torch.zeros_like(logprobs[:, :1]), logprobs], dim=1)  # (N, L)


def test_one_grpo_step_on_a_tiny_llama_moves_the_sampled_completion() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 5))  # (N, prompt)
    sampled_logprobs = []
    with torch.no_grad():
        for _ in range(8):
            logits = model(input_ids=ids).logits[:, -1].float() / TEMPERATURE  # (N, V)
            token = torch.multinomial(torch.softmax(logits, -1), 1)  # (N, 1)
            sampled_logprobs.append(torch.log_softmax(logits, -1).gather(-1, token))
            ids = torch.cat([ids, token], dim=1)
    batch = make_batch([5, 5], [8, 8], rewards=[1.0, 1.0], groups=[0, 1], vocab=64)
    batch.input_ids = ids
    mask = batch.loss_mask  # (N, 13), ones on the 8 sampled tokens
    with torch.no_grad():
        before = token_logprobs(model, ids)
    torch.testing.assert_close(before[:, 5:], torch.cat(sampled_logprobs, 1), rtol=1e-4, atol=1e-5)

    for sign in (1.0, -1.0):
        policy = copy.deepcopy(model)
        batch.extras["advantages"] = sign * mask
        totals = step_totals([mask], float(mask.sum()), max_completion_length=8)
        logprobs = token_logprobs(policy, ids)
        out = GRPO(GRPOConfig()).loss(ctx(batch, logprobs, logprobs.detach(), None, totals))
        out.loss.backward()
        torch.optim.SGD(policy.parameters(), lr=0.5).step()
        with torch.no_grad():
            after = token_logprobs(policy, ids)
        change = ((after - before) * mask).sum().item()
        assert change * sign > 0.05, (sign, change)
