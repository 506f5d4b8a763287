"""DAPO dynamic sampling: which groups a step keeps, and that the batch keeps its group structure
and loss denominators (only the kept groups' tokens count)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentrl.algorithms.dynamic_sampling import GroupSelector, has_spread
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError
from agentrl.plugins import load_plugins
from agentrl.testing import make_trajectory
from agentrl.training.trainer import Trainer
from agentrl.trajectory import collate

REWARD_FILE = '''
def even_tasks_flat(completions, a, **kwargs):
    """0 for every episode of a task with even ``a`` (a zero-spread group); otherwise the parity of
    the reply's length (a random tiny model's groups then usually have a spread)."""
    return [0.0 if x % 2 == 0 else float(len(c[-1]["content"]) % 2) for c, x in zip(completions, a)]
'''


@pytest.mark.parametrize(
    ("totals", "spread"),
    [
        ([0.0, 0.0, 0.0], False),
        ([1.0, 1.0], False),
        ([1.0, 2.0], True),
        ([0.0, 0.0, 1e-9], True),
        ([math.nan, 1.0, 1.0], False),
        ([math.nan, 0.0, 1.0], True),
        ([math.nan, 1.0], False),
        ([], False),
    ],
)
def test_has_spread_counts_only_scored_rewards(totals, spread):
    assert has_spread(totals) is spread


def _groups(*rewards_per_group: list[float]) -> tuple[list, list[float], dict[str, np.ndarray]]:
    trajectories, totals = [], []
    for g, rewards in enumerate(rewards_per_group):
        for r in rewards:
            trajectories.append(make_trajectory([{"role": "user", "content": f"q{g}"}], {"question": f"q{g}"}, group=g))
            totals.append(r)
    return trajectories, totals, {"env": np.array(totals, dtype=np.float64)}


def test_selector_keeps_spread_groups_in_order_and_fills_from_the_first_spares():
    selector = GroupSelector(wanted=3, group_size=2)
    selector.add(*_groups([1.0, 1.0], [0.0, 1.0], [0.0, 0.0]))  # round 1: one group with a spread
    assert (selector.missing, selector.sampled_groups) == (2, 3)
    selector.add(*_groups([2.0, 0.0]))  # round 2 (a refill round samples only what is missing)
    assert selector.missing == 1 and selector.filled == 1
    trajectories, totals, components = selector.batch(first_group=5)
    # kept: round 1's second group, round 2's group; then the first spare (round 1's first group)
    assert totals == [0.0, 1.0, 2.0, 0.0, 1.0, 1.0]
    assert components["env"].tolist() == totals
    assert [t.group for t in trajectories] == [5, 5, 6, 6, 7, 7]
    assert [t.task["question"] for t in trajectories] == ["q1", "q1", "q0", "q0", "q0", "q0"]


def test_selector_stops_keeping_once_it_has_enough():
    selector = GroupSelector(wanted=1, group_size=2)
    selector.add(*_groups([0.0, 1.0], [1.0, 0.0]))
    assert selector.missing == 0 and selector.filled == 0
    assert selector.batch(first_group=0)[1] == [0.0, 1.0]


def test_selector_without_filtering_keeps_every_group_as_sampled():
    selector = GroupSelector(wanted=2, group_size=2, filter_groups=False)
    selector.add(*_groups([1.0, 1.0], [0.0, 1.0]))
    assert selector.missing == 0
    assert selector.batch(first_group=0)[1] == [1.0, 1.0, 0.0, 1.0]


def test_selector_refuses_a_round_that_is_not_whole_groups():
    with pytest.raises(ValueError, match="not whole groups of 2"):
        GroupSelector(wanted=1, group_size=2).add(*_groups([0.0, 1.0, 1.0]))


def _trainer(tiny_model_dir, tmp_path, **overrides) -> Trainer:
    reward_file = tmp_path / "flat.py"
    reward_file.write_text(REWARD_FILE)
    config = dict(
        model=str(tiny_model_dir),
        max_steps=1,
        prompts_per_step=4,
        num_generations=4,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        precision="fp32",
        engine_args={"dtype": "float32"},
        rewards={f"{reward_file}:even_tasks_flat": 1.0},
        env_reward_weight=0.0,
    )
    config.update(overrides)
    return Trainer(TrainConfig(**config), load_plugins())


def test_dynamic_sampling_trains_on_whole_groups_with_a_spread(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, dynamic_sampling=True, max_sampling_rounds=6)
    batch, trajectories, metrics = trainer.rollout_step(1)
    config = trainer.config
    assert len(trajectories) == config.batch_size == batch.rewards.numel()
    rewards = batch.rewards.tolist()
    for g in range(config.prompts_per_step):  # whole, contiguous groups numbered 0..K-1, one task each
        rows = range(g * config.num_generations, (g + 1) * config.num_generations)
        assert all(batch.groups[r].item() == g == trajectories[r].group for r in rows)
        assert len({trajectories[r].task["question"] for r in rows}) == 1
        assert trajectories[rows[0]].task["a"] % 2 == 1  # even tasks never have a spread
        assert has_spread([rewards[r] for r in rows])
    assert metrics["sampling/rounds"] > 1 and metrics["sampling/filled_groups"] == 0
    assert metrics["sampling/groups_sampled"] > config.prompts_per_step
    assert 0 < metrics["sampling/spread_frac"] < 1
    # The batch is exactly the kept episodes collated alone: the loss denominators count only their tokens.
    alone = collate(trajectories, rewards, trainer.tokenizer.pad_token_id, env_reward_weight=0.0)
    for name in ("input_ids", "loss_mask", "rewards", "groups"):
        assert torch.equal(getattr(batch, name), getattr(alone, name)), name
    assert batch.loss_mask.sum().item() == sum(t.num_sampled_tokens for t in trajectories)
    # and GRPO sees no zero-spread group
    update_metrics: dict[str, float] = {}
    trainer.update(batch, update_metrics)
    assert update_metrics["advantage/frac_zero_std_groups"] == 0.0


def test_dynamic_sampling_fills_the_batch_when_the_rounds_run_out(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, dynamic_sampling=True, max_sampling_rounds=1)
    batch, trajectories, metrics = trainer.rollout_step(1)
    assert len(trajectories) == trainer.config.batch_size
    assert metrics["sampling/rounds"] == 1 and metrics["sampling/groups_sampled"] == 4
    even = sum(trajectories[g * 4].task["a"] % 2 == 0 for g in range(4))
    assert metrics["sampling/filled_groups"] >= even
    assert sorted(set(batch.groups.tolist())) == [0, 1, 2, 3]


def test_without_dynamic_sampling_the_batch_is_the_first_round_as_before(tiny_model_dir, tmp_path):
    plain = _trainer(tiny_model_dir, tmp_path)
    batch, trajectories, metrics = plain.rollout_step(1)
    assert not any(key.startswith("sampling/") for key in metrics)
    tasks = [
        plain.rollouts.tasks[i]
        for i in plain.rollouts.cursor.__class__(len(plain.rollouts.tasks), plain.config.seed).take(4)
    ]
    assert [t.task for t in trajectories[::4]] == tasks
    assert plain.rollouts.cursor.position == 4  # one round: the cursor moved by prompts_per_step


def test_max_sampling_rounds_must_be_positive():
    with pytest.raises(ConfigError, match="max_sampling_rounds must be >= 1, got 0"):
        TrainConfig(max_sampling_rounds=0)
