"""The parts of a run on the tiny in-process model, built without a Trainer (:func:`tiny_run`),
for tests that drive the rollout phase, the learner and the batches directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.training.build import Run, build_run

PARITY = {"agentrl.testing:parity_reward": 1.0}
"""About half of the tiny model's episodes score 1: groups with a reward spread, so updates train."""


def tiny_run(model_dir: Path, out: Path, **overrides: Any) -> Run:
    """A run of the tiny model saved in ``model_dir``: 2 tasks x 2 episodes a step, 6 tokens each,
    fp32, no evaluation (``overrides``: any other config values)."""
    config = dict(
        model=str(model_dir),
        max_steps=4,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(out),
        save_model=False,
        precision="fp32",
        engine_args={"dtype": "float32"},
        rewards=PARITY,
        learning_rate=1e-2,
    )
    return build_run(TrainConfig(**{**config, **overrides}), load_plugins())


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``module``'s parameters, by name."""
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def engine_holds(engine_model: torch.nn.Module, model: torch.nn.Module) -> bool:
    """Whether an engine's own copy of the weights (``engine_model``, in its dtype) holds ``model``'s."""
    held = dict(engine_model.named_parameters())
    return all(torch.equal(held[name], p.detach().to(held[name].dtype)) for name, p in model.named_parameters())
