"""The trainer on a tiny model: gradient invariance to micro-batching, logprob parity, eval parity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.config.train import TrainConfig
from agentrl.model.loading import load_model
from agentrl.plugins import load_plugins
from agentrl.testing import GradientRecorder, parity_reward
from agentrl.training.batching import plan_micro_batches
from agentrl.training.evaluate import evaluate
from agentrl.training.schedules import wsd_decay_steps
from agentrl.training.trainer import Trainer


def _config(model_dir, tmp_path, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
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
    )
    base.update(overrides)
    return TrainConfig(**base)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_gradient_does_not_depend_on_micro_batch_size(tiny_model_dir, tmp_path, loss_type):
    config = _config(tiny_model_dir, tmp_path, max_grad_norm=None, algorithm={"loss_type": loss_type, "beta": 0.05})
    trainer = Trainer(config, load_plugins())
    batch, _, _ = trainer.rollout_step(1)
    # A random tiny model never stops, so make the sampled spans ragged: drop the tails of some rows
    # (row 4 entirely: a fully masked sequence must not change anything either).
    for row, keep in enumerate([10, 3, 7, 1, 0, 10, 5, 2, 9]):
        batch.loss_mask[row, int(batch.lengths[row]) - 10 + keep :] = 0
    assert batch.loss_mask.sum(dim=1).unique().numel() > 5
    grads = []
    longest = int(batch.lengths.max())
    splits = [(9, 4096), (4, 4096), (1, 4096), (9, 2 * longest), (9, 1)]  # (rows, tokens) limits
    for size, tokens in splits:
        trainer.config = dataclasses.replace(config, micro_batch_size=size, micro_batch_tokens=tokens)
        trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
        trainer.update(batch, {})
        grads.append(trainer.run.trained["policy"].optimizer.steps[0])
    assert len(trainer.learner.micro_batch_rows(batch)) == 9  # the last split: one row each
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_micro_batch_plan_keeps_both_limits_and_every_row_once():
    lengths = [30, 100, 10, 60, 60, 500, 20, 5]
    plan = plan_micro_batches(lengths, max_rows=3, max_tokens=150)
    assert plan == [[5], [1], [3, 4], [0, 6, 2], [7]]
    assert sorted(r for g in plan for r in g) == list(range(len(lengths)))
    for group in plan:
        assert len(group) <= 3 and (len(group) * max(lengths[r] for r in group) <= 150 or len(group) == 1)
    assert plan_micro_batches(lengths, max_rows=8, max_tokens=10**6) == [[5, 1, 3, 4, 0, 6, 2, 7]]
    assert plan_micro_batches([], max_rows=2, max_tokens=10) == []


@pytest.mark.parametrize("support", [{}, {"top_k": 5}, {"top_p": 0.8}, {"top_k": 20, "top_p": 0.9}])
def test_step_zero_ratio_is_one_with_fp32_engine(tiny_model_dir, tmp_path, support):
    """Sampler and trainer logprobs agree on the same support, top_k/top_p included
    (docs/concepts/guards.md#logprob-parity)."""
    trainer = Trainer(_config(tiny_model_dir, tmp_path, temperature=0.7, **support), load_plugins())
    batch, _, metrics = trainer.rollout_step(1)
    trainer.update(batch, metrics)
    assert metrics["policy/sampler_logprob_gap"] < 1e-4
    assert metrics["clip/region"] == 0.0


def test_in_process_eval_equals_fresh_load_of_saved_run(tiny_model_dir, tmp_path):
    config = _config(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        save_model=True,
        learning_rate=1e-2,
        engine_args={"dtype": "bfloat16"},
        precision="bf16",
        rewards={"parity": 1.0},
    )
    manager = load_plugins()
    manager.registry.add("reward", "parity", parity_reward, plugin="test")
    trainer = Trainer(config, manager)
    result = trainer.train()
    tasks = list(trainer.envs[0].eval_tasks())[:6]
    _, live = evaluate(trainer.run.rollout, trainer.envs, tasks, max_new_tokens=10)
    fresh_config = dataclasses.replace(config, model=str(result.run_dir))
    manager = load_plugins()
    model = load_model(str(result.run_dir))
    engine = manager.registry.get("engine", "hf").factory(model=model, tokenizer=trainer.tokenizer, config=fresh_config)
    rollout = manager.registry.get("rollout", "multi_turn").factory(
        engine=engine, tokenizer=trainer.tokenizer, config=fresh_config
    )
    _, fresh = evaluate(rollout, trainer.envs, tasks, max_new_tokens=10)
    assert [t.token_ids for t in live] == [t.token_ids for t in fresh]
    before = load_model(str(tiny_model_dir))
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), model.state_dict().values()))


def test_warmup_steps_work_with_the_default_constant_schedule(tiny_model_dir, tmp_path):
    trainer = Trainer(
        _config(tiny_model_dir, tmp_path, max_steps=6, warmup_steps=4, learning_rate=1e-3), load_plugins()
    )
    rates = []
    for _ in range(6):
        rates.append(trainer.run.trained["policy"].scheduler.get_last_lr()[0])
        trainer.run.trained["policy"].optimizer.step()
        trainer.run.trained["policy"].scheduler.step()
    assert rates == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


def test_wsd_schedule_warms_up_holds_then_decays_linearly_to_zero(tiny_model_dir, tmp_path):
    """Hand-derived: 2 warm-up steps (0, lr/2), 4 steps at lr, then 4 decay steps (half of the 8 after
    warm-up) of lr/4 each."""
    trainer = Trainer(
        _config(
            tiny_model_dir,
            tmp_path,
            max_steps=10,
            warmup_steps=2,
            learning_rate=1e-3,
            lr_scheduler="wsd",
            lr_decay_fraction=0.5,
        ),
        load_plugins(),
    )
    rates = []
    for _ in range(11):
        rates.append(trainer.run.trained["policy"].scheduler.get_last_lr()[0])
        trainer.run.trained["policy"].optimizer.step()
        trainer.run.trained["policy"].scheduler.step()
    assert rates == pytest.approx([0.0, 5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 7.5e-4, 5e-4, 2.5e-4, 0.0], abs=1e-12)


@pytest.mark.parametrize(
    ("fraction", "steps", "expected"),
    [
        (0.375, 40, 15),  # the default run: constant for 25 steps, then 15 decay steps
        (0.375, 12, 4),  # 4.5 rounds to even
        (0.375, 2, 1),  # never fewer than one step
        (0.01, 10, 1),
        (1.0, 7, 7),  # the whole run decays: a linear schedule
    ],
)
def test_wsd_decay_steps_are_a_rounded_share_of_the_run(fraction: float, steps: int, expected: int) -> None:
    assert wsd_decay_steps(fraction, steps) == expected


def test_a_non_finite_loss_never_reaches_the_weights(tiny_model_dir, tmp_path):
    from agentrl_grpo import GRPO

    class Exploding(GRPO):
        """GRPO whose loss is NaN: the trainer must skip the optimizer step, not apply it."""

        def loss(self, context):
            out = super().loss(context)
            out.loss = out.loss * float("nan")
            return out

    manager = load_plugins()
    manager.registry.add("algorithm", "exploding", Exploding, plugin="test")
    trainer = Trainer(_config(tiny_model_dir, tmp_path, algo="exploding", learning_rate=1e-2), manager)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    batch, _, metrics = trainer.rollout_step(1)
    with pytest.warns(RuntimeWarning, match="not finite; the optimizer step was skipped"):
        trainer.update(batch, metrics, step=1)
    assert metrics["train/nonfinite_skipped_steps"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert all(p.grad is None for p in trainer.model.parameters())
