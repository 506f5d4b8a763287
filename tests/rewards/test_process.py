"""Process supervision: StepRewards from reward functions, how they mix with outcome rewards, and
the process-supervised GRPO advantage against an independent float64 computation (by hand and on
random batches), including groups whose step rewards are all equal and episodes with no step."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from agentrl import StepRewards, Trajectory, Turn, collate, group_advantages, process_advantages
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, RewardError
from agentrl.plugins import load_plugins
from agentrl.rewards.process import outcome_steps, step_ends
from agentrl.rewards.scoring import score
from agentrl.training.trainer import Trainer
from agentrl_grpo import GRPO, GRPOConfig

SQRT2 = math.sqrt(2.0)


def _episode(
    length: int, spans: list[tuple[int, int]], group: int = 0, token_ids: list[int] | None = None
) -> Trajectory:
    mask = [0] * length
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    return Trajectory(
        token_ids=token_ids or list(range(length)),
        loss_mask=mask,
        sampler_logprobs=[0.0] * length,
        turns=[Turn(start, end) for start, end in spans],
        messages=[],
        task={"id": "t"},
        group=group,
    )


def _tensors(rows: list[tuple[int, list[tuple[int, int]], dict[int, float]]], width: int):
    """(step_rewards, step_ends, loss_mask, groups) of rows (group, loss spans, {position: reward})."""
    steps, ends, mask = (torch.zeros(len(rows), width, dtype=torch.float64) for _ in range(3))
    for i, (_, spans, rewards) in enumerate(rows):
        for start, end in spans:
            mask[i, start:end] = 1
        for position, reward in rewards.items():
            steps[i, position], ends[i, position] = reward, 1
    return steps, ends, mask, torch.tensor([g for g, _, _ in rows])


def _reference(rows, width: int, scale: str = "group", eps: float = 1e-4) -> list[list[float]]:
    """Seed 002's process advantage in plain Python floats: pooled group statistics of the step
    rewards, each token's advantage the sum of the normalised rewards of the steps at or after it."""
    pooled: dict[int, list[float]] = {}
    for group, _, rewards in rows:
        pooled.setdefault(group, []).extend(rewards.values())
    everything = [r for values in pooled.values() for r in values]
    out = []
    for group, spans, rewards in rows:
        values = pooled[group]
        mean = sum(values) / len(values) if values else 0.0
        if scale == "group":
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) if values else 0.0
        elif scale == "batch":
            mu = sum(everything) / len(everything)
            std = math.sqrt(sum((v - mu) ** 2 for v in everything) / len(everything))
        else:
            std = 1.0
        constant = len(values) < 2 or max(values) == min(values)
        normalised = {
            p: 0.0 if constant else (r - mean) / (max(std, eps) if scale != "none" else 1.0) for p, r in rewards.items()
        }
        row = [0.0] * width
        for start, end in spans:
            for t in range(start, end):
                row[t] = sum(v for p, v in normalised.items() if p >= t)
        out.append(row)
    return out


def test_process_advantage_by_hand():
    # group 0: pooled step rewards [3, 0, 0]: mean 1, std sqrt(2); normalised sqrt(2), -1/sqrt(2), -1/sqrt(2)
    # (the third episode has no step: it adds nothing to the statistics and gets 0 everywhere)
    # group 1: step rewards all 0.5: advantage exactly 0
    rows = [
        (0, [(2, 8)], {3: 3.0, 7: 0.0}),
        (0, [(2, 6)], {5: 0.0}),
        (0, [(2, 4)], {}),
        (1, [(1, 4)], {2: 0.5, 3: 0.5}),
        (1, [(1, 3)], {2: 0.5}),
    ]
    steps, ends, mask, groups = _tensors(rows, 10)
    advantages, stats = process_advantages(steps, ends, mask, groups)
    a, b = 1 / SQRT2, -1 / SQRT2
    expected = [[0, 0, a, a, b, b, b, b, 0, 0], [0, 0, b, b, b, b, 0, 0, 0, 0], [0] * 10, [0] * 10, [0] * 10]
    assert torch.allclose(advantages.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert advantages.dtype == torch.float64 and stats["frac_zero_std_groups"] == 0.5


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_process_advantage_equals_an_independent_float64_computation(scale, seed):
    rng, width, rows = random.Random(seed), 24, []
    for i in range(12):
        start, end = rng.randint(1, 6), rng.randint(7, width)
        spans = [(start, end)] if rng.random() < 0.6 else [(start, start + 3), (start + 5, end)]
        sampled = [t for s, e in spans for t in range(s, e)]
        positions = rng.sample(sampled, rng.randint(0, min(4, len(sampled))))  # 0: an episode with no step
        group = i // 4
        value = lambda: round(rng.uniform(-2, 2), 1) if group != 2 else 1.0  # group 2: std 0  # noqa: E731, B023
        rows.append((group, spans, {p: value() for p in positions}))
    steps, ends, mask, groups = _tensors(rows, width)
    advantages, _ = process_advantages(steps.double(), ends, mask.double(), groups, scale)
    expected = torch.tensor(_reference(rows, width, scale), dtype=torch.float64)
    assert torch.allclose(advantages, expected, rtol=1e-12, atol=1e-12)
    assert advantages[8:].abs().max() == 0  # the constant group


def test_one_step_at_the_last_token_is_the_outcome_advantage():
    mask = torch.zeros(6, 9)
    for i, (start, end) in enumerate([(2, 7), (2, 9), (3, 5), (1, 8), (2, 4), (2, 6)]):
        mask[i, start:end] = 1
    rewards = torch.tensor([1.0, 0.0, 0.5, float("nan"), 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    steps, ends = outcome_steps(rewards, mask)
    process, _ = process_advantages(steps, ends, mask, groups)
    outcome, _ = group_advantages(rewards, groups)
    assert torch.allclose(process, outcome[:, None] * mask, atol=1e-6)
    assert process[3].abs().max() == 0 and process[4:].abs().max() == 0


def test_step_rewards_and_outcome_rewards_mix_in_scoring_and_collate():
    episodes = [_episode(10, [(2, 5), (6, 9)]), _episode(8, [(2, 7)]), _episode(8, [(2, 7)])]
    prm = lambda trajectories: [
        StepRewards.per_turn(trajectories[0], [1.0, -0.5]),  # noqa: E731
        StepRewards.at([3, 6], [0.25, 0.5]),
        StepRewards.at([], []),
    ]
    outcome = lambda trajectories: [1.0, None, 0.0]  # noqa: E731
    totals, components = score(episodes, {"prm": (prm, 2.0), "acc": (outcome, 1.0)}, env_weight=1.0)
    assert episodes[0].step_rewards == {4: 2.0, 8: -1.0 + 1.0}  # acc's 1.0 on the last sampled token
    assert episodes[1].step_rewards == {3: 0.5, 6: 1.0}
    assert episodes[2].step_rewards == {6: 0.0}  # prm had no step (not scored); acc's outcome at token 6
    assert totals == [2.0, 1.5, 0.0] and math.isnan(components["prm"][2]) and components["prm"][0] == 0.5
    batch = collate(episodes, totals, pad_token_id=0)
    assert batch.extras["step_ends"].nonzero().tolist() == [[0, 4], [0, 8], [1, 3], [1, 6], [2, 6]]
    assert batch.extras["step_rewards"][0, 4] == 2.0 and batch.extras["step_rewards"][1, 6] == 1.0
    plain = [_episode(8, [(2, 7)])]
    score(plain, {"acc": (lambda trajectories: [1.0], 1.0)}, env_weight=1.0)
    assert plain[0].step_rewards is None and collate(plain, [1.0], pad_token_id=0).extras == {}


def test_bad_step_rewards_are_named():
    episode = _episode(8, [(2, 5)])
    with pytest.raises(
        RewardError,
        match=r"reward 'prm' put a step reward at token 6, which the model did not "
        r"sample: expected a position in 2\.\.4",
    ):
        score([episode], {"prm": (lambda trajectories: [StepRewards.at([6], [1.0])], 1.0)}, env_weight=1.0)
    with pytest.raises(RewardError, match=r"StepRewards value nan is invalid: expected a finite number"):
        StepRewards.at([3], [float("nan")])
    with pytest.raises(RewardError, match=r"per_turn got 2 values for 1 turns"):
        StepRewards.per_turn(episode, [1.0, 2.0])
    with pytest.raises(ConfigError, match=r"algorithm\.advantage='steps' is invalid: expected one of"):
        GRPOConfig(advantage="steps")


def test_step_ends_are_the_tokens_completing_each_separator(tokenizer):
    text = "First, add.\n\nThen multiply.\n\nSo 12."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    episode = _episode(len(ids) + 2, [(2, len(ids) + 2)], token_ids=[0, 0, *ids])
    ends = step_ends(episode, tokenizer)
    decoded = [tokenizer.decode(episode.token_ids[2 : e + 1]) for e in ends]
    assert len(ends) == 3 and ends[-1] == len(ids) + 1
    assert decoded[0].endswith("add.\n\n") and decoded[1].endswith("multiply.\n\n") and decoded[2] == text
    first = step_ends(episode, tokenizer, separator="multiply")[0]  # the token completing the separator
    assert "multiply" in tokenizer.decode(episode.token_ids[2 : first + 1])
    assert "multiply" not in tokenizer.decode(episode.token_ids[2:first])
    with pytest.raises(ValueError, match="step separator '' is invalid"):
        step_ends(episode, tokenizer, separator="")


def test_grpo_process_advantage_on_a_batch_uses_the_step_rewards():
    episodes = [_episode(9, [(2, 8)], group=0), _episode(9, [(2, 6)], group=0)]
    episodes[0].step_rewards, episodes[1].step_rewards = {3: 3.0, 7: 0.0}, {5: 0.0}
    batch = collate(episodes, [3.0, 0.0], pad_token_id=0)
    metrics: dict[str, float] = {}
    advantages = GRPO(GRPOConfig(advantage="process")).compute_advantages(batch, metrics)
    assert torch.allclose(advantages[0, 2:8], torch.tensor([1, 1, -1, -1, -1, -1]) / SQRT2)
    assert metrics["advantage/steps_per_episode"] == 1.5
    outcome = GRPO(GRPOConfig()).compute_advantages(batch, {})
    assert torch.equal(outcome, group_advantages(batch.rewards, batch.groups)[0][:, None] * batch.loss_mask)


STEP_REWARD = '''
from agentrl import StepRewards

def per_turn_length(trajectories):
    """A step reward per turn: 1 if the turn sampled more than 4 tokens."""
    return [StepRewards.per_turn(t, [float(turn.end - turn.start > 4) for turn in t.turns if turn.end > turn.start])
            for t in trajectories]
'''


def test_training_with_step_rewards_and_the_process_advantage(tiny_model_dir, tmp_path):
    (tmp_path / "steps.py").write_text(STEP_REWARD)
    config = TrainConfig(
        model=str(tiny_model_dir),
        max_steps=2,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(tmp_path / "out"),
        rewards={str(tmp_path / "steps.py") + ":per_turn_length": 1.0, "format": 1.0},
        algorithm={"advantage": "process"},
    )
    result = Trainer(config, load_plugins()).train()
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(row["advantage/steps_per_episode"] >= 1.0 for row in rows)
    assert all(math.isfinite(row["loss/total"]) for row in rows)
