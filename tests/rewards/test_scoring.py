"""agentrl.rewards.scoring: reward functions' values become each episode's reward. A reward function
that raises or hangs leaves its samples unscored and counted in ``errors/reward/<fn>`` (``on_call_error:
skip``: the run goes on, the episodes left out of the gradient) or stops the run with one error naming
the function, the sample and the exception (``fail``); non-finite values count as not scored, per
component; weighted values beyond ±1e9 are refused by name; the env's per-turn rewards are weighted by
``env_reward_weight`` in the totals and in the per-token rewards alike."""

from __future__ import annotations

import math
import re
import time
import warnings

import numpy as np
import pytest
import torch
from faulty_plugin import run_config, run_metrics, unclipped_run_config

from agentrl.env import MAX_ABS_REWARD, CallGuard
from agentrl.errors import RewardError, TrainingError
from agentrl.plugins import load_plugins
from agentrl.rewards.scoring import score
from agentrl.testing import GradientRecorder, make_trajectory
from agentrl.training.trainer import Trainer
from agentrl.trajectory import Trajectory, Turn, collate
from agentrl_grpo import group_advantages


# -- reward functions that raise or hang -----------------------------------------------------------
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_a_failed_reward_leaves_its_episode_out_of_the_gradient(tiny_model_dir, tmp_path, loss_type):
    config = unclipped_run_config(
        tiny_model_dir,
        tmp_path,
        prompts_per_step=2,
        num_generations=3,
        algorithm={"loss_type": loss_type, "beta": 0.05},
    )
    trainer = Trainer(config, load_plugins())
    _, trajectories, _ = trainer.rollout_step(1)
    bad = trajectories[1]

    def first_token(trajectories):  # distinct values, so every group has signal
        if any(t is bad for t in trajectories):
            raise ValueError("cannot score this one")
        return [t.token_ids[t.prompt_length] % 97 / 97 for t in trajectories]

    errors: dict[str, int] = {}
    with pytest.warns(RuntimeWarning, match=re.escape("reward function 'first_token' raised on sample 1 (task ")):
        totals, components = score(
            trajectories,
            {"first_token": (first_token, 1.0)},
            env_weight=0.0,
            guard=CallGuard(timeout_s=5, on_error="skip"),
            errors=errors,
        )
    assert errors == {"first_token": 1}
    assert math.isnan(totals[1]) and all(math.isfinite(x) for i, x in enumerate(totals) if i != 1)
    batch = collate(trajectories, totals, trainer.tokenizer.pad_token_id)
    assert batch.loss_mask[1].sum() == 0  # out of the loss, its KL term and the denominators
    advantages, _ = group_advantages(batch.rewards, batch.groups)
    scored = torch.tensor([totals[0], totals[2]], dtype=torch.float64)  # group 0 without the bad one
    expected = (scored - scored.mean()) / scored.std(unbiased=False)
    assert advantages[1] == 0
    torch.testing.assert_close(advantages[[0, 2]].double(), expected, rtol=1e-5, atol=1e-6)

    keep = [0, 2, 3, 4, 5]
    grads = []
    for rows in (list(range(6)), keep):  # the batch with the unscored episode, and without it
        trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
        trainer.update(batch.select(rows), {})
        grads.append(trainer.run.trained["policy"].optimizer.steps[0])
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_a_raising_reward_with_skip_is_counted_and_the_run_finishes(tiny_model_dir, tmp_path, faults):
    config = unclipped_run_config(
        tiny_model_dir,
        tmp_path,
        env=f"{faults}:Tasks",
        rewards={f"{faults}:fragile": 1.0},
        max_steps=2,
        on_call_error="skip",
    )
    with pytest.warns(RuntimeWarning, match="reward function 'fragile' raised on sample") as record:
        Trainer(config, load_plugins()).train()
    assert sum("reward function 'fragile'" in str(w.message) for w in record) == 1  # warned once per run
    rows = run_metrics(tmp_path)
    assert [r["errors/reward/fragile"] for r in rows] == [2.0, 2.0]  # both samples of the 'bad' task
    assert [r["reward/scored_frac"] for r in rows] == [0.5, 0.5]
    assert [r["errors/env"] for r in rows] == [0.0, 0.0]


def test_a_raising_reward_with_fail_names_the_function_the_sample_and_the_exception(tiny_model_dir, tmp_path, faults):
    config = unclipped_run_config(
        tiny_model_dir, tmp_path, env=f"{faults}:Tasks", rewards={f"{faults}:fragile": 1.0}, on_call_error="fail"
    )
    trainer = Trainer(config, load_plugins())
    with pytest.raises(RewardError) as caught:
        trainer.rollout_step(1)
    message = str(caught.value)
    assert re.search(
        r"^reward function 'fragile' raised on sample \d \(task 'bad': 'Say 2\.'\): "
        r"ValueError: cannot score the bad task \(on_call_error=fail",
        message,
    ), message


def test_a_hanging_reward_times_out_and_the_step_finishes(tiny_model_dir, tmp_path, faults):
    config = unclipped_run_config(
        tiny_model_dir,
        tmp_path,
        env=f"{faults}:Tasks",
        rewards={f"{faults}:slow": 1.0},
        env_reward_weight=0.0,
        call_timeout_s=1.0,
        on_call_error="skip",
    )
    trainer = Trainer(config, load_plugins())
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="reward function 'slow' timed out on the batch of 4 samples"):
        with pytest.raises(TrainingError, match=r"the run trained nothing: 1 of 1 steps .*slow failed on 4"):
            trainer.train()  # its only step scored nothing: the run says so
    assert time.perf_counter() - start < 20  # the hang lasts 30 s; a loaded 2-core CI machine needs the margin
    (row,) = run_metrics(tmp_path)
    assert row["errors/reward/slow"] == 4.0 and row["reward/scored_frac"] == 0.0
    assert row["train/skipped_unscored_batch"] == 1.0  # every episode unscored: the trainer skips the update


# -- rewards too large for the training math -------------------------------------------------------
def test_huge_rewards_are_refused_naming_the_reward_and_the_value():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    trajectories = [make_trajectory(messages, {"id": f"t{i}", "question": "q"}) for i in range(2)]
    at_bound = {"edge": (lambda trajectories: [MAX_ABS_REWARD, -MAX_ABS_REWARD], 1.0)}
    totals, _ = score(trajectories, at_bound, env_weight=1.0)
    assert totals == [MAX_ABS_REWARD, -MAX_ABS_REWARD]
    huge = {"huge": (lambda trajectories: [1.0, -1e308], 1.0)}
    with pytest.raises(
        RewardError,
        match=re.escape(
            "reward function 'huge' returned -1e+308 for sample 1 (task 't1': "
            "'q'): weighted rewards must be within ±1e+09"
        ),
    ):
        score(trajectories, huge, env_weight=1.0, guard=CallGuard(on_error="skip"))
    weighted = {"big": (lambda trajectories: [1.0, 2.0], 1e9)}
    with pytest.raises(RewardError, match=re.escape("reward function 'big' returned 2 (x weight 1e+09) for sample 1")):
        score(trajectories, weighted, env_weight=1.0)


def test_a_huge_reward_in_a_run_is_named_not_skipped_as_unscored(tiny_model_dir, tmp_path, faults):
    config = run_config(tiny_model_dir, tmp_path, env=f"{faults}:Tasks", rewards={f"{faults}:huge": 1.0})
    with pytest.raises(RewardError, match=r"^reward function 'huge' returned 1e\+308 for sample 0 .*within ±1e\+09"):
        Trainer(config, load_plugins()).train()


# -- env rewards and non-finite values -------------------------------------------------------------
def _two_turn(rewards):
    return Trajectory(
        token_ids=list(range(10, 20)),
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1, 1, 1],
        sampler_logprobs=[0.0] * 10,
        turns=[Turn(3, 5, reward=rewards[0]), Turn(7, 10, reward=rewards[1])],
        messages=[],
        task={},
    )


def test_env_reward_weight_reaches_the_per_turn_rewards():
    trajectories = [_two_turn([0.5, 1.0])]
    totals, _ = score(trajectories, {}, env_weight=0.3)
    batch = collate(trajectories, totals, pad_token_id=0, env_reward_weight=0.3)
    assert totals == [pytest.approx(0.45)]
    assert batch.token_rewards[0].tolist() == pytest.approx([0, 0, 0, 0, 0.15, 0, 0, 0, 0, 0.3])
    assert float(batch.token_rewards.sum()) == pytest.approx(totals[0])


def test_infinite_rewards_count_as_not_scored():
    def bad(trajectories):
        return [math.inf, 1.0, -math.inf]

    trajectories = [_two_turn([0.0, 0.0]) for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        totals, components = score(trajectories, {"bad": (bad, 1.0)}, env_weight=1.0)
    assert totals == [0.0, 1.0, 0.0]  # the env still scored the first and last; no inf in any total
    assert np.isnan(components["bad"][0]) and np.isnan(components["bad"][2])
    assert [str(w.message) for w in caught] == [
        "reward 'bad' gave 2 non-finite value(s) (inf or NaN); they count as not scored"
    ]


def test_non_finite_rewards_are_counted_per_component():
    def shaky(trajectories):
        return [math.nan, None, -math.inf]

    trajectories = [_two_turn([0.0, 0.0]), _two_turn([0.0, math.inf]), _two_turn([1.0, 0.0])]
    counts: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        totals, components = score(trajectories, {"shaky": (shaky, 2.0)}, env_weight=1.0, nonfinite=counts)
    assert counts == {"env": 1, "shaky": 2}  # None is "not scored", not a non-finite value
    assert totals[0] == 0.0 and math.isnan(totals[1]) and totals[2] == 1.0
    assert np.isnan(components["env"][1]) and np.isnan(components["shaky"]).all()
    assert [str(w.message) for w in caught] == [
        "reward 'env' gave 1 non-finite value(s) (inf or NaN); they count as not scored",
        "reward 'shaky' gave 2 non-finite value(s) (inf or NaN); they count as not scored",
    ]
