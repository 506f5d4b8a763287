"""Rollout metrics count an agent episode's every segment."""

from __future__ import annotations

from agentrl.rundir.metrics import rollout_metrics
from agentrl.trajectory import Trajectory, Turn


def _row(prompt: int, sampled: int) -> Trajectory:
    """A one-turn row of ``prompt`` prompt tokens then ``sampled`` sampled ones."""
    ids = list(range(prompt + sampled))
    return Trajectory(
        token_ids=ids,
        loss_mask=[0] * prompt + [1] * sampled,
        sampler_logprobs=[0.0] * len(ids),
        turns=[Turn(start=prompt, end=prompt + sampled)],
        messages=[],
        task={},
    )


def test_sampled_tokens_and_turns_sum_an_episodes_segments():
    agent = _row(50, 4)
    agent.segments = [_row(30, 7), _row(40, 9)]  # two earlier calls whose history the agent rewrote
    plain = _row(20, 10)
    metrics = rollout_metrics([agent, plain])
    assert metrics["rollout/sampled_tokens_mean"] == (7 + 9 + 4 + 10) / 2
    assert metrics["rollout/sampled_tokens_max"] == 20 and metrics["rollout/sampled_tokens_min"] == 10
    assert metrics["rollout/turns_mean"] == (3 + 1) / 2
