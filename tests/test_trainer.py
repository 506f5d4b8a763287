"""The trainer on a tiny model: gradient invariance to micro-batching, logprob parity, eval parity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.config import TrainConfig
from agentrl.evaluate import evaluate
from agentrl.models import load_model
from agentrl.plugins import load_plugins
from agentrl.trainer import Trainer


def _config(model_dir, tmp_path, **overrides) -> TrainConfig:
    base = dict(model=str(model_dir), max_steps=1, prompts_per_step=3, num_generations=3, max_new_tokens=10,
                eval_tasks=0, output_dir=str(tmp_path / "run"), log_completions_every=0, save_model=False,
                precision="fp32", engine_args={"dtype": "float32"})
    base.update(overrides)
    return TrainConfig(**base)


class GradientRecorder:
    """Stands in for the optimizer: keeps each step's gradients instead of applying them."""

    def __init__(self, params):
        self.params, self.steps = list(params), []

    def step(self):
        self.steps.append([p.grad.detach().clone() for p in self.params])

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_gradient_does_not_depend_on_micro_batch_size(tiny_model_dir, tmp_path, loss_type):
    config = _config(tiny_model_dir, tmp_path, max_grad_norm=None, algorithm={"loss_type": loss_type, "beta": 0.05})
    trainer = Trainer(config, load_plugins())
    batch, _, _ = trainer.rollout_step(1)
    # A random tiny model never stops, so make the sampled spans ragged: drop the tails of some rows
    # (row 4 entirely: a fully masked sequence must not change anything either).
    for row, keep in enumerate([10, 3, 7, 1, 0, 10, 5, 2, 9]):
        batch.loss_mask[row, int(batch.lengths[row]) - 10 + keep:] = 0
    assert batch.loss_mask.sum(dim=1).unique().numel() > 5
    grads = []
    for size in (9, 4, 1):
        trainer.config = dataclasses.replace(config, micro_batch_size=size)
        trainer.optimizer = GradientRecorder(trainer.model.parameters())
        trainer.update(batch, {})
        grads.append(trainer.optimizer.steps[0])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_step_zero_ratio_is_one_with_fp32_engine(tiny_model_dir, tmp_path):
    trainer = Trainer(_config(tiny_model_dir, tmp_path, temperature=0.7), load_plugins())
    batch, _, metrics = trainer.rollout_step(1)
    trainer.update(batch, metrics)
    assert metrics["policy/sampler_logprob_gap"] < 1e-4
    assert metrics["clip/region"] == 0.0


def parity_reward(trajectories):
    """1 when the first sampled token id is odd: a reward a random model earns half the time."""
    return [float(t.token_ids[t.prompt_length] % 2) for t in trajectories]


def test_in_process_eval_equals_fresh_load_of_saved_run(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path, max_steps=2, save_model=True, learning_rate=1e-2,
                     engine_args={"dtype": "bfloat16"}, precision="bf16", rewards={"parity": 1.0})
    manager = load_plugins()
    manager.registry.add("reward", "parity", parity_reward, plugin="test")
    trainer = Trainer(config, manager)
    result = trainer.train()
    tasks = list(trainer.envs[0].eval_tasks())[:6]
    _, live = evaluate(trainer.rollout, trainer.envs, tasks, max_new_tokens=10)
    fresh_config = dataclasses.replace(config, model=str(result.run_dir))
    manager = load_plugins()
    model = load_model(str(result.run_dir))
    engine = manager.registry.get("engine", "hf").factory(model=model, tokenizer=trainer.tokenizer, config=fresh_config)
    rollout = manager.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=trainer.tokenizer,
                                                                     config=fresh_config)
    _, fresh = evaluate(rollout, trainer.envs, tasks, max_new_tokens=10)
    assert [t.token_ids for t in live] == [t.token_ids for t in fresh]
    before = load_model(str(tiny_model_dir))
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), model.state_dict().values()))
