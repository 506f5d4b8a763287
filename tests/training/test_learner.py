"""The learner on its own (no Trainer): an update trains the policy and says so, leaves the
engine alone, skips an unscored batch and stops a stuck run; its micro-batch plan, sampling
weights and forward precision."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from training_parts import engine_holds, tiny_run, weights

from agentrl.errors import TrainingError
from agentrl.model.precision import Precision
from agentrl.training.learner import Learner
from agentrl.training.rollout_phase import RolloutPhase


def test_an_update_trains_the_policy_says_so_and_leaves_the_engine_alone(tiny_model_dir, tmp_path):
    run = tiny_run(tiny_model_dir, tmp_path, engine_args={"dtype": "bfloat16"})  # the engine's own copy
    learner, taken = Learner(run), RolloutPhase(run).collect(1)
    before = weights(run.model)
    assert engine_holds(run.engine.model, run.model)
    assert learner.update(taken.batch, taken.metrics, step=1) is True
    after = weights(run.model)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert math.isfinite(taken.metrics["loss/total"]) and learner.skipped_in_a_row == 0
    assert not engine_holds(run.engine.model, run.model)  # the run's batches hand the weights over


def test_unscored_batches_are_skipped_and_counted_until_the_run_is_stuck(tiny_model_dir, tmp_path):
    run = tiny_run(tiny_model_dir, tmp_path, max_nonfinite_steps=2)
    learner, phase = Learner(run), RolloutPhase(run)
    before = weights(run.model)
    for step in (1, 2):
        taken = phase.collect(step)
        taken.batch.rewards[:] = float("nan")
        with pytest.warns(RuntimeWarning, match=f"step {step}: no episode of the batch has a finite reward"):
            assert learner.update(taken.batch, taken.metrics, step) is False
        assert taken.metrics["train/skipped_unscored_batch"] == 1.0 and learner.skipped_in_a_row == step
        assert learner.stuck() == (step == 2)
    assert all(torch.equal(before[name], p) for name, p in weights(run.model).items())
    message = "steps 1-2: 2 steps in a row trained nothing (max_nonfinite_steps=2): 2 had no scored episode; stopping"
    with pytest.raises(TrainingError, match=re.escape(message)):
        learner.stop_if_stuck(2, tmp_path)


def test_the_micro_batch_plan_follows_the_config_and_the_sampling_weights_are_the_model(tiny_model_dir, tmp_path):
    run = tiny_run(tiny_model_dir, tmp_path)
    learner, batch = Learner(run), RolloutPhase(run).collect(1).batch
    run.config = dataclasses.replace(run.config, micro_batch_size=1)
    assert sorted(learner.micro_batch_rows(batch)) == [[row] for row in range(batch.num_rows)]
    run.config = dataclasses.replace(run.config, micro_batch_size=64, micro_batch_tokens=10**6)
    [rows] = learner.micro_batch_rows(batch)
    assert sorted(rows) == list(range(batch.num_rows))
    assert [mb.num_rows for mb in learner.micro_batches(batch)] == [batch.num_rows]
    assert learner.sampling_model() is run.model  # no LoRA, no sharded weights


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_forward_passes_run_in_the_run_s_precision(name, dtype):
    with Precision(name, "a test").autocast(torch.device("cpu")):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype


def update_recording_grad_mode(run, batch, metrics) -> list[bool]:
    """``learner.update`` on ``batch``, returning whether each policy forward ran with grad."""
    modes: list[bool] = []
    decoder = run.model.get_decoder()  # the trainer runs the decoder, then its own output head
    handle = decoder.register_forward_pre_hook(lambda *_: modes.append(torch.is_grad_enabled()))
    try:
        Learner(run).update(batch, metrics, step=1)
    finally:
        handle.remove()
    return modes


@pytest.mark.parametrize("rewards", [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], ids=["one-equal-group", "all-equal"])
def test_a_micro_batch_of_equal_reward_groups_takes_no_backward_and_trains_the_same_weights(
    tiny_model_dir, tmp_path, rewards
):
    """GRPO: a group whose rewards are all equal has advantage 0, so its gradient is exactly 0; the
    learner leaves its backward out (unless no micro-batch would have one) and the weights and the
    step's statistics are bit for bit those of the update that ran it."""
    outcomes = []
    for leave_out in (True, False):
        run = tiny_run(tiny_model_dir, tmp_path / str(leave_out), micro_batch_size=2)  # a micro-batch a group
        taken = RolloutPhase(run).collect(1)
        batch = taken.batch
        order = torch.argsort(batch.groups, stable=True)  # rows of the first group, then the second's
        batch.rewards[order] = torch.tensor(rewards, dtype=batch.rewards.dtype)
        if not leave_out:
            run.algorithm.inert_rows = lambda mb: None  # the update as it was: every micro-batch backpropagated
        modes = update_recording_grad_mode(run, batch, taken.metrics)
        outcomes.append((modes, weights(run.model), taken.metrics))
    (modes, after, metrics), (all_modes, expected, expected_metrics) = outcomes
    assert [mb.num_rows for mb in Learner(run).micro_batches(batch)] == [2, 2]
    assert all_modes == [True, True]  # the policy forward of each micro-batch (old logprobs: none needed)
    assert sorted(modes) == [False, True]  # one micro-batch without a backward
    if rewards[0] == rewards[1]:
        assert modes == [False, True]  # every group equal: the last keeps its backward, the step is on zeros
    assert all(torch.equal(after[name], expected[name]) for name in expected)
    initial = weights(tiny_run(tiny_model_dir, tmp_path / "initial").model)
    moved = any(not torch.equal(after[name], initial[name]) for name in initial)
    assert moved == (rewards[0] != rewards[1])  # the varying group trained; zeros alone move nothing
    assert metrics == expected_metrics


def test_equal_reward_groups_are_planned_apart_so_their_micro_batch_takes_no_backward(tiny_model_dir, tmp_path):
    """Four groups of two, two groups to a micro-batch, each planned micro-batch one group with equal
    rewards and one without: planned apart, the equal groups share a micro-batch of their own
    (first) that takes no backward, and the weights are those of the update that backpropagated
    every micro-batch as first planned, to float rounding (the groups with gradient now share a
    micro-batch: their gradient is summed in another order)."""
    outcomes = []
    for leave_out in (True, False):
        run = tiny_run(tiny_model_dir, tmp_path / str(leave_out), prompts_per_step=4, micro_batch_size=4)
        taken = RolloutPhase(run).collect(1)
        batch = taken.batch
        plan = Learner(run).micro_batch_rows(batch)  # by tokens: the rewards do not move it
        assert len(plan) == 2
        for rows in plan:
            equal, varying = batch.groups[rows].unique().tolist()
            batch.rewards[batch.groups == equal] = 1.0
            batch.rewards[batch.groups == varying] = torch.tensor([1.0, 0.0], dtype=batch.rewards.dtype)
        if not leave_out:
            run.algorithm.inert_rows = lambda mb: None
        modes = update_recording_grad_mode(run, batch, taken.metrics)
        outcomes.append((modes, weights(run.model)))
    (modes, after), (all_modes, expected) = outcomes
    assert all_modes == [True, True]  # as first planned: each micro-batch has a group with gradient
    assert modes == [False, True]  # planned apart: the equal groups first, without a backward
    initial = weights(tiny_run(tiny_model_dir, tmp_path / "initial").model)
    for name in expected:
        torch.testing.assert_close(after[name] - initial[name], expected[name] - initial[name], rtol=1e-4, atol=1e-5)
    assert any(not torch.equal(expected[name], initial[name]) for name in initial)
