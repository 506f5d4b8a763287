"""The PPO plugin: config, GAE/whitening/value loss against plain-loop float64 references, reward
placement, and the trainer with a critic (gradient isolation, split invariance, warm-up, saving)."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys

import pytest
import torch
from cli_in_process import agentrl_in_process

from agentrl import ConfigError, TrainBatch, Trajectory, Turn, collate
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import GradientRecorder
from agentrl.training.trainer import Trainer
from agentrl_ppo import PPOConfig, episode_rewards, explained_variance, gae, value_loss, whiten

# ---------------------------------------------------------------------------------------------
# Config


def test_defaults_and_every_option_listed():
    config = PPOConfig()
    assert (config.gamma, config.lam, config.credit, config.value_clip) == (1.0, 1.0, "episode", 0.2)
    expected = {
        "gamma",
        "lam",
        "credit",
        "critic_learning_rate",
        "critic_lr_warmup_steps",
        "critic_max_grad_norm",
        "critic_warmup_steps",
        "value_clip",
        "whiten_advantages",
        "ppo_epochs",
        "mini_batches",
        "epsilon_low",
        "epsilon_high",
        "delta",
        "importance_sampling_level",
        "beta",
        "kl_in",
        "kl_estimator",
        "loss_type",
        "ref_sync_every",
        "ref_sync_mix",
    }
    assert {f.name for f in dataclasses.fields(PPOConfig)} == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 1.5}, "algorithm.gamma=1.5 is invalid: expected a number in [0, 1]"),
        ({"lam": float("nan")}, "algorithm.lam=nan is invalid: expected a finite number"),
        ({"credit": "token"}, "algorithm.credit='token' is invalid: expected one of 'episode', 'turn'"),
        ({"critic_learning_rate": 0}, "algorithm.critic_learning_rate=0 is invalid: expected a number > 0"),
        ({"value_clip": 0.0}, "algorithm.value_clip=0.0 is invalid: expected None or a number > 0"),
        ({"ppo_epochs": 0}, "algorithm.ppo_epochs=0 is invalid: expected an integer >= 1"),
        ({"mini_batches": 1.5}, "algorithm.mini_batches=1.5 is invalid: expected an integer >= 1"),
        ({"critic_warmup_steps": -1}, "algorithm.critic_warmup_steps=-1 is invalid: expected an integer >= 0"),
        ({"whiten_advantages": "yes"}, "algorithm.whiten_advantages='yes' is invalid: expected true or false"),
        ({"kl_in": "both"}, "algorithm.kl_in='both' is invalid: expected one of 'loss', 'reward'"),
        (
            {"beta": 0.1, "kl_estimator": "k3"},
            "algorithm.kl_estimator='k3' is invalid: KL in the reward is k1 with no gradient; set kl_in=loss",
        ),
        ({"delta": 1.1}, "algorithm.delta=1.1 is invalid: expected None or a number > 1 + epsilon_high = 1.2"),
        ({"loss_type": "mean"}, "algorithm.loss_type='mean' is invalid: expected one of"),
        ({"importance_sampling_level": "seq"}, "algorithm.importance_sampling_level='seq' is invalid: expected one of"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        PPOConfig(**kwargs)


def test_kl_in_loss_takes_any_estimator():
    assert PPOConfig(beta=0.1, kl_in="loss", kl_estimator="k3").kl_estimator == "k3"


# ---------------------------------------------------------------------------------------------
# GAE, whitening, value loss: plain python loops in float64, written apart from the plugin.


def reference_gae(rewards, values, mask, gamma, lam):
    """Walk each row's sampled tokens backwards; env tokens (mask 0) are skipped entirely."""
    advantages = [[0.0] * len(row) for row in mask]
    returns = [[0.0] * len(row) for row in mask]
    for i, row in enumerate(mask):
        following_value, carried = 0.0, 0.0
        for t in range(len(row) - 1, -1, -1):
            if not row[t]:
                continue
            delta = rewards[i][t] + gamma * following_value - values[i][t]
            carried = delta + gamma * lam * carried
            advantages[i][t] = carried
            returns[i][t] = carried + values[i][t]
            following_value = values[i][t]
    return advantages, returns


def ragged_multi_turn_mask(rng: random.Random, rows: int, width: int) -> list[list[int]]:
    """Rows of prompt, then 1-3 turns of sampled tokens separated by env tokens, ending anywhere."""
    mask = []
    for _ in range(rows):
        row, t = [0] * width, rng.randint(1, 4)
        for _ in range(rng.randint(1, 3)):
            span = rng.randint(1, 5)
            for k in range(t, min(t + span, width)):
                row[k] = 1
            t += span + rng.randint(1, 4)  # env tokens between turns
            if t >= width:
                break
        mask.append(row)
    mask.append([0] * width)  # a row with no sampled token at all
    return mask


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8), (0.99, 0.0)])
def test_gae_matches_plain_loop_reference(gamma, lam):
    rng = random.Random(f"{gamma}-{lam}")
    width = 24
    mask = ragged_multi_turn_mask(rng, 9, width)
    rewards = [[rng.uniform(-1, 1) if m else rng.uniform(-5, 5) for m in row] for row in mask]  # junk off the mask
    values = [[rng.uniform(-1, 1) for _ in row] for row in mask]
    expected_adv, expected_ret = reference_gae(rewards, values, mask, gamma, lam)
    advantages, returns = gae(
        torch.tensor(rewards), torch.tensor(values), torch.tensor(mask, dtype=torch.float32), gamma, lam
    )
    assert advantages.dtype == torch.float64
    torch.testing.assert_close(advantages, torch.tensor(expected_adv, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(returns, torch.tensor(expected_ret, dtype=torch.float64), rtol=1e-6, atol=1e-6)


def test_gae_by_hand_bootstraps_across_an_env_gap():
    # tokens: prompt, a1, a2, env, env, b1 ; reward 1 on b1 (the episode's end), values given.
    mask = torch.tensor([[0, 1, 1, 0, 0, 1]], dtype=torch.float32)
    rewards = torch.tensor([[0, 0, 0.5, 9, 9, 1.0]])  # 0.5: turn 1's reward on its stop token a2
    values = torch.tensor([[7, 0.2, 0.4, 7, 7, 0.6]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    d_b1 = 1.0 - 0.6  # terminal: no next value
    d_a2 = 0.5 + 0.9 * 0.6 - 0.4  # the next model token's value bootstraps across the env tokens
    d_a1 = 0.0 + 0.9 * 0.4 - 0.2
    a_b1, a_a2 = d_b1, d_a2 + 0.45 * d_b1
    a_a1 = d_a1 + 0.45 * a_a2
    assert advantages[0].tolist() == pytest.approx([0, a_a1, a_a2, 0, 0, a_b1])
    assert returns[0].tolist() == pytest.approx([0, a_a1 + 0.2, a_a2 + 0.4, 0, 0, a_b1 + 0.6])


def test_whiten_uses_masked_statistics_only():
    rng = random.Random(3)
    mask = ragged_multi_turn_mask(rng, 6, 15)
    values = [[rng.uniform(-3, 3) if m else 1e6 for m in row] for row in mask]  # huge junk off the mask
    on = [v for row, mrow in zip(values, mask) for v, m in zip(row, mrow) if m]
    mean = sum(on) / len(on)
    std = (sum((v - mean) ** 2 for v in on) / len(on)) ** 0.5
    expected = [[(v - mean) / std if m else 0.0 for v, m in zip(row, mrow)] for row, mrow in zip(values, mask)]
    got = whiten(torch.tensor(values, dtype=torch.float64), torch.tensor(mask))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_reference(clip):
    rng = random.Random(str(clip))
    new = [rng.uniform(-1, 1) for _ in range(50)]
    old = [rng.uniform(-1, 1) for _ in range(50)]
    ret = [rng.uniform(-1, 1) for _ in range(50)]
    expected = []
    for v, o, r in zip(new, old, ret):
        loss = (v - r) ** 2
        if clip is not None:
            clipped_v = min(max(v, o - clip), o + clip)
            loss = max(loss, (clipped_v - r) ** 2)
        expected.append(0.5 * loss)
    got, clipped = value_loss(*(torch.tensor(x, dtype=torch.float64) for x in (new, old, ret)), clip)
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert (clipped.sum() > 0) == (clip is not None)


def test_explained_variance():
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4), returns, mask) == pytest.approx(0.0)
    # var(R) = 2/3, var(R - V) with V = [_, 1, 1, 1]: residual [0, 1, 2] -> 2/3 - but shifted: also 2/3 -> 0
    assert explained_variance(torch.tensor([[9.0, 2.0, 2.0, 2.0]]), returns, mask) == pytest.approx(0.0)


# ---------------------------------------------------------------------------------------------
# Reward placement, by hand.


def two_turn_trajectory(turn_rewards: list[float]) -> Trajectory:
    """ids: 3 prompt, 2 sampled (turn 1, stop token last), 2 env, 3 sampled (turn 2)."""
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    return Trajectory(
        token_ids=list(range(10, 20)),
        loss_mask=mask,
        sampler_logprobs=[0.0] * 10,
        turns=[Turn(3, 5, reward=turn_rewards[0]), Turn(7, 10, reward=turn_rewards[1])],
        messages=[],
        task={},
    )


def test_turn_rewards_land_on_each_turns_stop_token():
    trajectories = [two_turn_trajectory([0.3, 1.0]), two_turn_trajectory([0.0, 0.0])]
    # totals: env return (1.3, 0.0) plus 0.5 from a reward function on the first; NaN on the second.
    batch = collate(trajectories, [1.8, float("nan")], pad_token_id=0)
    assert batch.token_rewards[0].tolist() == pytest.approx([0, 0, 0, 0, 0.3, 0, 0, 0, 0, 1.0])
    turn, scored = episode_rewards(batch, "turn")
    assert turn[0].tolist() == pytest.approx([0, 0, 0, 0, 0.3, 0, 0, 0, 0, 1.0 + 0.5])
    episode, _ = episode_rewards(batch, "episode")
    assert episode[0].tolist() == pytest.approx([0] * 9 + [1.8])
    assert scored.tolist() == [True, False] and turn[1].abs().sum() == 0 and episode[1].abs().sum() == 0


# ---------------------------------------------------------------------------------------------
# The trainer with a critic (tiny random model, real tokenizer, real hf engine).


def _config(model_dir, tmp_path, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
        algo="ppo",
        max_steps=1,
        prompts_per_step=3,
        num_generations=3,
        max_new_tokens=10,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        precision="fp32",
        engine_args={"dtype": "float32"},
        max_grad_norm=None,
    )
    base.update(overrides)
    return TrainConfig(**base)


def _ragged(batch: TrainBatch) -> TrainBatch:
    """A random tiny model never stops: cut some rows' sampled spans short (row 4 entirely)."""
    for row, keep in enumerate([10, 3, 7, 1, 0, 10, 5, 2, 9]):
        batch.loss_mask[row, int(batch.lengths[row]) - 10 + keep :] = 0
    batch.rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.2, 1.0, 0.0, 0.7])
    return batch


def test_policy_and_critic_each_get_only_their_own_gradient_for_any_split(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, algorithm={"critic_max_grad_norm": None})
    trainer = Trainer(config, load_plugins())
    critic = trainer.algorithm.critic.module
    policy_ids = {id(p) for p in trainer.model.parameters()}
    assert not policy_ids & {id(p) for p in critic.parameters()}  # separate models
    batch = _ragged(trainer.rollout_step(1)[0])
    recorded = []
    longest = int(batch.lengths.max())
    for size, tokens in [(9, 4096), (4, 4096), (1, 4096), (9, 2 * longest)]:
        trainer.config = dataclasses.replace(config, micro_batch_size=size, micro_batch_tokens=tokens)
        trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
        trainer.run.trained["critic"].optimizer = GradientRecorder(critic.parameters())
        trainer.update(batch, {})
        recorded.append(
            (trainer.run.trained["policy"].optimizer.steps[0], trainer.run.trained["critic"].optimizer.steps[0])
        )
    for policy_grads, critic_grads in recorded[1:]:
        for a, b in zip(recorded[0][0] + recorded[0][1], policy_grads + critic_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

    # Independently: the policy's gradient is that of the surrogate alone, the critic's that of the
    # value loss alone (computed here on the whole batch, with no trainer involved).
    from agentrl import AGGREGATIONS, clipped_surrogate, masked, step_totals
    from agentrl.model.policy import TokenLogprobs

    mask = batch.loss_mask
    totals = step_totals([mask], float(mask.sum()), trainer.learner.max_sampled)
    logprobs, _ = TokenLogprobs(trainer.model)(batch.input_ids, batch.attention_mask, mask)
    per_token, _ = clipped_surrogate(masked(logprobs - logprobs.detach(), mask), batch.extras["advantages"], 0.2, 0.2)
    policy_loss = AGGREGATIONS["dapo"](per_token, mask, totals)
    expected_policy = torch.autograd.grad(policy_loss, list(trainer.model.parameters()), allow_unused=True)
    values = critic(batch.input_ids, batch.attention_mask, mask)
    value_mask = batch.extras["value_mask"]
    value_part = (0.5 * (values - batch.extras["returns"]) ** 2 * value_mask).sum() / float(mask.sum())
    expected_critic = torch.autograd.grad(value_part, list(critic.parameters()), allow_unused=True)
    for got, want in zip(recorded[0][0] + recorded[0][1], list(expected_policy) + list(expected_critic)):
        if want is None:
            assert got is None or torch.count_nonzero(got) == 0
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    assert any(g is not None and torch.count_nonzero(g) for g in recorded[0][1])  # the critic does learn


def test_mini_batches_and_epochs_give_that_many_optimizer_steps(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, algorithm={"mini_batches": 3, "ppo_epochs": 2})
    trainer = Trainer(config, load_plugins())
    assert trainer.algorithm.needs_old_logprobs
    batch = _ragged(trainer.rollout_step(1)[0])
    parts = trainer.learner.mini_batch_rows(batch, step=1, epoch=0)
    assert sorted(r for part in parts for r in part) == list(range(9)) and [len(p) for p in parts] == [3, 3, 3]
    assert parts != trainer.learner.mini_batch_rows(batch, step=1, epoch=1)  # reshuffled each epoch
    assert parts == trainer.learner.mini_batch_rows(batch, step=1, epoch=0)  # and reproducible
    trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
    critic = trainer.run.trained["critic"]
    critic.optimizer = GradientRecorder(critic.module.parameters())
    metrics: dict[str, float] = {}
    trainer.update(batch, metrics, step=1)
    assert (
        len(trainer.run.trained["policy"].optimizer.steps) == 6
        and len(trainer.run.trained["critic"].optimizer.steps) == 6
    )
    assert metrics["clip/region"] == 0.0  # nothing moved (recorders), so every ratio is 1


def test_too_many_mini_batches_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=re.escape("asks for 10 mini-batches but a rollout batch has only 9")):
        Trainer(_config(tiny_model_dir, tmp_path, algorithm={"mini_batches": 10}), load_plugins())


def test_critic_warmup_freezes_the_policy_then_trains_both(tiny_model_dir, tmp_path):
    config = _config(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        learning_rate=1e-2,
        algorithm={"critic_warmup_steps": 1, "critic_learning_rate": 1e-2},
    )
    trainer = Trainer(config, load_plugins())
    critic = trainer.algorithm.critic.module
    snapshot = lambda module: [p.detach().clone() for p in module.parameters()]  # noqa: E731
    policy0, critic0 = snapshot(trainer.model), snapshot(critic)
    batch, _, metrics = trainer.rollout_step(1)
    trainer.update(_ragged(batch), metrics, step=1)
    assert all(torch.equal(a, b) for a, b in zip(policy0, snapshot(trainer.model)))
    assert any(not torch.equal(a, b) for a, b in zip(critic0, snapshot(critic)))
    assert "loss/policy" not in metrics and metrics["loss/value"] > 0
    batch, _, metrics = trainer.rollout_step(2)
    trainer.update(_ragged(batch), metrics, step=2)
    assert any(not torch.equal(a, b) for a, b in zip(policy0, snapshot(trainer.model)))
    assert "loss/policy" in metrics


def test_kl_in_the_reward_is_k1_of_old_vs_reference(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, algorithm={"beta": 0.5, "whiten_advantages": False})
    trainer = Trainer(config, load_plugins())
    assert trainer.run.ref_model is not None and trainer.algorithm.needs_old_logprobs
    with torch.no_grad():  # make the reference differ from the policy
        for p in trainer.run.ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = _ragged(trainer.rollout_step(1)[0])
    metrics: dict[str, float] = {}
    trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
    trainer.update(batch, metrics)
    mask = batch.loss_mask
    k1 = (batch.extras["old_logprobs"] - batch.extras["ref_logprobs"]) * mask
    assert metrics["kl/reward_k1_mean"] == pytest.approx(float(k1.sum() / mask.sum()), rel=1e-5)
    # gamma = lam = 1: return at a token = later rewards = final reward - beta * (k1 from here on)
    rewards, _ = episode_rewards(batch, "episode")
    tail = torch.flip(torch.cumsum(torch.flip(rewards - 0.5 * k1.double(), [1]), 1), [1]) * mask
    torch.testing.assert_close(batch.extras["returns"].double(), tail, rtol=1e-5, atol=1e-5)


def test_two_steps_through_the_cli_save_the_critic(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    command = [
        "train",
        "--env",
        "guess",
        "--algo",
        "ppo",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "eval_tasks=2",
        "--set",
        "max_new_tokens=6",
        "--set",
        "algorithm.credit=turn",
        "--set",
        "algorithm.mini_batches=2",
    ]
    result = agentrl_in_process(*command)  # the CLI's run, no process's test: in this process
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 2]
    for key in ("loss/value", "loss/policy", "critic/explained_variance", "critic/grad_norm", "train/grad_norm"):
        assert key in lines[0], key
    assert (out / "critic" / "config.json").is_file() and (out / "critic" / "value_head.pt").is_file()
    assert (out / "model" / "config.json").is_file()


def test_print_config_lists_every_ppo_option():
    command = ["train", "--algo", "ppo", "--print-config", "--set", "algorithm.credit=turn"]
    result = agentrl_in_process(*command)
    assert result.returncode == 0, result.stderr
    for field in dataclasses.fields(PPOConfig):
        assert f"  {field.name}:" in result.stdout, field.name
    assert "credit: turn" in result.stdout
    bad = agentrl_in_process(*command[:-2], "--set", "algorithm.gama=0.9")
    assert bad.returncode == 2 and "unknown key(s) 'gama' in algorithm; PPOConfig accepts:" in " ".join(
        bad.stderr.split()
    )


@pytest.mark.slow
def test_ppo_on_the_real_default_model_multi_turn(tmp_path):
    """``--algo ppo`` with per-turn credit on the embedded SmolLM2, two small steps of guess
    (3 turns at most: the test's longest run on the real model; PPO needs no groups, so 2 x 2
    episodes a step, which takes a fifth less time than 2 x 4; no evaluation and no checkpoint (policy,
    critic and their AdamW moments: ~3 GB to write): other tests cover them)."""
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "agentrl.cli.app",
        "train",
        "--env",
        "guess",
        "--algo",
        "ppo",
        "--max-steps",
        "2",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=12",
        "--set",
        "algorithm.credit=turn",
        "--set",
        "env_args.consistency_bonus=0.1",
        "--set",
        "env_args.max_turns=3",
        "--set",
        "algorithm.critic_learning_rate=1e-3",
        "--set",
        "checkpoint_every=0",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["policy/sampler_logprob_gap"] < 0.1  # bf16 sampler vs trainer at step 1
    assert lines[0]["critic/values_mean"] == 0.0  # zero-initialised value head
    assert lines[1]["critic/values_mean"] != 0.0  # the critic moved after one step
    assert lines[0]["rollout/turns_mean"] > 1.0 and lines[0]["loss/value"] > 0.0
    assert (out / "critic" / "value_head.pt").is_file()


def test_the_critic_packed_gives_the_padded_values_and_gradients(tiny_model_dir, monkeypatch):
    """With ``pack_sequences`` the critic runs a group's rows as one prefix tree (the shared prompt
    once), as the policy's forward does: the values and gradients of the padded critic."""
    from agentrl.model.loading import load_model
    from agentrl_ppo import ValueModel

    policy = load_model(str(tiny_model_dir))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 100, (12,), generator=g).tolist()
    rows = [prompt + torch.randint(3, 100, (n,), generator=g).tolist() for n in (6, 3, 8, 5)]
    width = max(map(len, rows))
    ids, attention = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], attention[i, : len(row)] = torch.tensor(row), 1
    loss_mask = attention.float()
    loss_mask[:, :12] = 0
    weights = torch.randn(ids.shape, generator=g)
    results = {}
    for pack in (False, True):
        torch.manual_seed(0)
        critic = ValueModel.from_policy(policy, pack=pack)
        torch.nn.init.normal_(critic.head.weight)  # zero-initialised values would hide any difference
        lengths = []
        forward = critic.decoder.forward
        monkeypatch.setattr(
            critic.decoder,
            "forward",
            lambda *a, seen=lengths, run=forward, **k: seen.append(k["input_ids"].shape) or run(*a, **k),
        )
        values = critic(ids, attention, loss_mask)
        grads = torch.autograd.grad((values * weights).sum(), list(critic.parameters()))
        results[pack] = (values.detach(), grads, lengths)
    assert results[False][2] == [ids.shape] and results[True][2] == [(1, 12 + 6 + 3 + 8 + 5)]
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=1e-5)
    assert (results[True][0][:, 1:][loss_mask[:, 1:] > 0] != 0).all() and (results[True][0][loss_mask == 0] == 0).all()
    for packed, padded in zip(results[True][1], results[False][1]):  # the head's weights are N(0, 1): larger gradients
        torch.testing.assert_close(packed, padded, rtol=1e-4, atol=1e-5)


def test_a_critic_whose_packed_forward_disagrees_runs_padded(tiny_model_dir, monkeypatch):
    import agentrl_ppo
    from agentrl.model import packed_forward
    from agentrl.model.loading import load_model

    policy = load_model(str(tiny_model_dir))
    assert agentrl_ppo.ValueModel.from_policy(policy, pack=True).pack  # the tiny model packs as it should
    real = packed_forward.selected_hidden_states

    def off_when_packed(*args, pack=True, **kwargs):  # a model whose attention ignored the packed mask
        hidden, where = real(*args, pack=pack, **kwargs)
        return (hidden + 1.0 if pack else hidden), where

    monkeypatch.setattr(packed_forward, "selected_hidden_states", off_when_packed)  # what the check runs
    with pytest.warns(RuntimeWarning, match="the critic runs padded rows"):
        critic = agentrl_ppo.ValueModel.from_policy(policy, pack=True)
    assert critic.pack is False
