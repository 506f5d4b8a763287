"""The rollout phase on its own (no Trainer): a step's batch with its episodes, metrics and
rewards, the rewind to a step's start, and the version stamp of an asynchronous collection."""

from __future__ import annotations

import pytest
import torch
from training_parts import tiny_run

from agentrl.training.rollout_phase import RolloutPhase


@pytest.fixture
def phase(tiny_model_dir, tmp_path) -> RolloutPhase:
    return RolloutPhase(tiny_run(tiny_model_dir, tmp_path))


def test_a_collection_is_the_step_s_batch_with_its_episodes_metrics_and_rewards(phase):
    cfg = phase.run.config
    taken = phase.collect(1)
    episodes = cfg.prompts_per_step * cfg.num_generations
    assert taken.batch.num_rows == len(taken.episodes) == len(taken.rewards) == episodes
    assert taken.batch.groups.tolist() == [g for g in range(cfg.prompts_per_step) for _ in range(cfg.num_generations)]
    torch.testing.assert_close(taken.batch.rewards.double(), torch.tensor(taken.rewards, dtype=torch.float64))
    assert [e.group for e in taken.episodes] == taken.batch.groups.tolist()
    assert taken.metrics["reward/scored_frac"] == 1.0
    assert taken.metrics["reward/total_mean"] == pytest.approx(sum(taken.rewards) / episodes)
    assert phase.cursor.position == cfg.prompts_per_step  # the next step takes the next tasks
    assert "policy_versions" not in taken.batch.extras  # a synchronous collection records no version


def test_a_rewind_returns_to_the_step_s_start_and_the_step_samples_the_same_again(phase):
    boundary = phase.boundary()
    first = phase.collect(1)
    drawn = torch.rand(4)
    phase.rewind(boundary)
    assert phase.cursor.position == 0
    assert torch.equal(torch.rand(4), drawn)  # the RNG states are the step's start's too
    phase.rewind(boundary)
    again = phase.collect(1)
    assert torch.equal(again.batch.input_ids, first.batch.input_ids)
    assert [e.task for e in again.episodes] == [e.task for e in first.episodes]


def test_an_asynchronous_collection_stamps_its_version_on_every_sampled_token(phase):
    phase.sampling_version = 3
    batch = phase.collect(5).batch
    versions, sampled = batch.extras["policy_versions"], batch.loss_mask > 0
    assert sampled.any() and set(versions[sampled].tolist()) == {3}
    assert set(versions[~sampled].tolist()) <= {-1}
