"""A reward function may explain its score (``agentrl.Scored``): the details land in the episode's
``judgements`` with the component's value as scored, beside plain returns and step rewards."""

from __future__ import annotations

import math

import pytest

from agentrl import Scored, StepRewards
from agentrl.env import CallGuard
from agentrl.errors import RewardError
from agentrl.rewards.scoring import score
from agentrl.rundir.episodes import episode_record
from agentrl.testing import make_trajectory


def episodes(n: int) -> list:
    return [
        make_trajectory(
            [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}], {"id": str(i)}
        )
        for i in range(n)
    ]


def explained(trajectories):
    """Scores each episode by its index, explained; the third not scored (None) but explained too."""
    out = []
    for t in trajectories:
        i = int(t.task["id"])
        value = None if i == 2 else StepRewards.per_turn(t, [0.5]) if i == 3 else i / 10
        out.append(Scored(value, {"prompt": f"grade {t.messages[-1]['content']}", "reply": f"Score: {i}"}))
    return out


def plain(trajectories):
    return [1.0] * len(trajectories)


def test_details_are_kept_per_episode_with_the_component_value():
    batch = episodes(4)
    totals, components = score(batch, {"judge": (explained, 1.0), "plain": (plain, 1.0)}, env_weight=0.0)
    assert [t.info["judgements"] for t in batch] == [
        [{"reward": "judge", "prompt": f"grade a{i}", "reply": f"Score: {i}", "score": score}]
        for i, score in enumerate([0.0, 0.1, None, 0.5])
    ]
    assert list(components["judge"][:2]) == [0.0, 0.1] and math.isnan(components["judge"][2])
    assert totals == [1.0, 1.1, 1.0, 1.5]
    record = episode_record(batch[1], total=totals[1], components={k: float(v[1]) for k, v in components.items()})
    assert record["judgements"] == [{"reward": "judge", "prompt": "grade a1", "reply": "Score: 1", "score": 0.1}]
    assert record["judgements"][0]["score"] == record["rewards"]["judge"] and "judgements" not in record["info"]
    assert "judgements" not in episode_record(episodes(1)[0])  # a reward that explains nothing adds nothing


def test_a_failed_sample_keeps_its_details_unscored_and_a_bad_inner_value_names_the_function():
    def flaky(trajectories):
        if len(trajectories) > 1:
            raise ValueError("batch")
        if trajectories[0].task["id"] == "1":
            raise ValueError("this one")
        return [Scored(1.0, {"reply": "ok"})]

    batch = episodes(2)
    with pytest.warns(RuntimeWarning, match="reward function 'flaky' raised on sample 1"):
        score(batch, {"flaky": (flaky, 1.0)}, env_weight=0.0, guard=CallGuard(None, "skip"))
    assert batch[0].info["judgements"] == [{"reward": "flaky", "reply": "ok", "score": 1.0}]
    assert "judgements" not in batch[1].info
    with pytest.raises(RewardError, match=r"returned 'high' for sample 0: expected float, StepRewards, Scored or None"):
        score(episodes(1), {"bad": (lambda trajectories: [Scored("high")], 1.0)}, env_weight=0.0)
