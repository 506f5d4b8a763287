"""Sampler/trainer mismatch correction (TIS, MIS): weights, masks, denominators and metrics against
independent float64 computations; the sampler's logprobs compared on the trainer's support."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl import ConfigError
from agentrl.config.startup import resolve_settings
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import parity_reward
from agentrl.training.trainer import Trainer
from agentrl_sampler_correction import SamplerCorrectionConfig, log_weights


def _trainer(model_dir, tmp_path, correction: dict, **overrides) -> Trainer:
    base = dict(
        model=str(model_dir),
        max_steps=1,
        prompts_per_step=2,
        num_generations=4,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        precision="fp32",
        engine_args={"dtype": "float32"},
        rewards={"parity": 1.0},
        plugins={"sampler_correction": correction},
    )
    base.update(overrides)
    manager = load_plugins()
    manager.registry.add("reward", "parity", parity_reward, plugin="test")
    return Trainer(TrainConfig(**base), manager)


def _group_advantages(rewards: list[float], groups: list[int]) -> list[float]:
    """GRPO's (R - group mean) / max(population std, 1e-4), 0 for a constant group, in Python floats."""
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / len(members))
        out.append(0.0 if max(members) == min(members) else (r - mean) / max(std, 1e-4))
    return out


def _forged_batch(trainer: Trainer, offsets: list[float]):
    """A rollout batch whose sampler logprobs are the trainer's own plus a known offset per row,
    so that log(pi_old / pi_sampler) = -offset on every sampled token of that row."""
    batch, _, metrics = trainer.rollout_step(1)
    old = trainer.learner.frozen_logprobs(trainer.accelerator.unwrap_model(trainer.run.policy), batch)
    shift = torch.tensor(offsets, dtype=old.dtype)[:, None]
    batch.sampler_logprobs = (old + shift) * batch.loss_mask
    return batch, metrics


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_log_weights_match_a_float64_reference(level):
    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float64)
    old, sampler = -torch.rand(3, 5, dtype=torch.float64), -torch.rand(3, 5, dtype=torch.float64)
    got = log_weights(old, sampler, mask, level)
    for i in range(3):
        diffs = [float(old[i, t] - sampler[i, t]) for t in range(5) if mask[i, t]]
        if level == "token":
            for t in range(5):
                assert float(got[i, t]) == pytest.approx(float(old[i, t] - sampler[i, t]) if mask[i, t] else 0.0)
        elif level == "sequence":  # log of the product of the token ratios
            assert float(got[i, 0]) == pytest.approx(sum(diffs))
        else:  # log of their geometric mean
            assert float(got[i, 0]) == pytest.approx(sum(diffs) / len(diffs) if diffs else 0.0)


def test_fp32_engine_with_top_k_measures_a_ratio_of_one(tiny_model_dir, tmp_path):
    """Logprob parity (docs/concepts/guards.md#logprob-parity): with top_k the engine's renormalised logprob exceeds the trainer's by -log(kept
    mass); compared on the same support, an fp32 sampler and the fp32 trainer agree to 1e-4."""
    trainer = _trainer(tiny_model_dir, tmp_path, {"mode": "measure"}, top_k=5)
    batch, _, metrics = trainer.rollout_step(1)
    trainer.update(batch, metrics)
    assert metrics["mismatch/abs_log_ratio"] < 1e-4 and metrics["policy/sampler_logprob_gap"] < 1e-4
    assert abs(metrics["mismatch/ratio_min"] - 1) < 1e-4 and abs(metrics["mismatch/ratio_max"] - 1) < 1e-4
    assert abs(metrics["mismatch/kl"]) < 1e-8 and abs(metrics["policy/sampler_kl"]) < 1e-8
    assert metrics["clip/region"] == 0.0


def test_bf16_engine_mismatch_is_measured(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, {"mode": "measure"}, engine_args={"dtype": "bfloat16"})
    batch, _, metrics = trainer.rollout_step(1)
    trainer.update(batch, metrics)
    assert metrics["mismatch/abs_log_ratio"] > 1e-4 and metrics["mismatch/kl"] > 0
    assert metrics["mismatch/ratio_min"] < 1 < metrics["mismatch/ratio_max"]


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_mis_drops_out_of_range_tokens_and_the_denominator_counts_only_kept_ones(tiny_model_dir, tmp_path, level):
    trainer = _trainer(tiny_model_dir, tmp_path, {"mode": "mis", "cap": 1.5, "level": level})
    offsets = [0.0, 2.0, 0.1, -2.0, 0.0, -0.3, 1.0, 0.05]  # token w = exp(-offset)
    batch, metrics = _forged_batch(trainer, offsets)
    mask_before = batch.loss_mask.clone()
    trainer.update(batch, metrics)
    tokens = mask_before.sum(dim=1).tolist()
    # log w of a row's unit: -offset per token (token, geometric), -offset x tokens (sequence product)
    log_w = [-o * (n if level == "sequence" else 1) for o, n in zip(offsets, tokens)]
    kept_rows = [-math.log(1.5) <= lw <= math.log(1.5) for lw in log_w]
    assert batch.loss_mask.sum(dim=1).tolist() == [n if k else 0.0 for n, k in zip(tokens, kept_rows)]
    weights = tokens if level == "token" else [1.0] * len(tokens)  # masked share of tokens, or of sequences
    assert metrics["mismatch/frac_masked"] == pytest.approx(
        sum(w for w, k in zip(weights, kept_rows) if not k) / sum(weights)
    )
    advantages = _group_advantages(batch.rewards.tolist(), batch.groups.tolist())
    # One optimizer step on-policy: r = 1, so the dapo loss is -sum(A over kept tokens) / kept tokens.
    expected = -sum(a * n for a, n, k in zip(advantages, tokens, kept_rows) if k) / sum(
        n for n, k in zip(tokens, kept_rows) if k
    )
    assert metrics["loss/policy"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_multiplies_the_loss_by_the_truncated_weight(tiny_model_dir, tmp_path, level):
    trainer = _trainer(tiny_model_dir, tmp_path, {"mode": "tis", "cap": 2.0, "level": level})
    offsets = [0.0, -1.0, 0.1, 0.5, -0.05, -0.3, 1.0, -0.2]
    batch, metrics = _forged_batch(trainer, offsets)
    trainer.update(batch, metrics)
    tokens = batch.loss_mask.sum(dim=1).tolist()
    advantages = _group_advantages(batch.rewards.tolist(), batch.groups.tolist())
    if level == "token":  # every token of row i has w = exp(-offset_i)
        weights = [min(math.exp(-o), 2.0) for o in offsets]
    else:  # the product over the row's tokens
        weights = [min(math.exp(-o * n), 2.0) for o, n in zip(offsets, tokens)]
    expected = -sum(a * n * w for a, n, w in zip(advantages, tokens, weights)) / sum(tokens)
    assert metrics["loss/policy"] == pytest.approx(expected, abs=1e-6)
    units = (
        [(math.exp(-o), n) for o, n in zip(offsets, tokens) if n]
        if level == "token"
        else [(math.exp(-o * n), 1) for o, n in zip(offsets, tokens) if n]
    )
    truncated = sum(n for w, n in units if w > 2.0) / sum(n for _, n in units)
    assert metrics["mismatch/frac_truncated"] == pytest.approx(truncated)


def test_off_changes_nothing_and_computes_no_old_logprobs(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, {})
    assert not trainer.run.needs_old_logprobs
    batch, _, metrics = trainer.rollout_step(1)
    trainer.update(batch, metrics)
    assert "old_logprobs" not in batch.extras and not any(k.startswith("mismatch/") for k in metrics)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"mode": "clip"},
            "plugins.sampler_correction.mode='clip' is invalid: expected one of auto, off, measure, tis, mis",
        ),
        (
            {"level": "seq"},
            "plugins.sampler_correction.level='seq' is invalid: expected one of token, sequence, geometric",
        ),
        ({"cap": 1.0}, "plugins.sampler_correction.cap=1.0 is invalid: expected a finite number > 1"),
        ({"lower": 2}, "plugins.sampler_correction.lower=2 is invalid: expected None or a number in (0, 1)"),
        ({"kap": 3}, "unknown key(s) 'kap' in plugins.sampler_correction; SamplerCorrectionConfig accepts:"),
    ],
)
def test_bad_settings_are_named(section, message):
    with pytest.raises(ConfigError) as error:
        resolve_settings(TrainConfig(plugins={"sampler_correction": section}), load_plugins().registry)
    assert message in str(error.value)


def test_unknown_section_lists_the_known_ones():
    with pytest.raises(
        ConfigError,
        match="unknown plugin settings section plugins.sampler_corection; sections: "
        "judge, multi_turn, openai_agent, process_reward_model, reward_model, sampler_correction",
    ):
        resolve_settings(TrainConfig(plugins={"sampler_corection": {}}), load_plugins().registry)
    resolved = resolve_settings(TrainConfig(), load_plugins().registry)
    assert resolved["sampler_correction"] == SamplerCorrectionConfig()
