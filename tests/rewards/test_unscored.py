"""agentrl.rewards.unscored: why episodes went unscored, from hand-built trajectories as any rollout
records them (``info["error"]`` from an agent or env call, a non-finite return, no reward function
scoring it), added over steps, as metrics and back, in one line; and the untrained-step messages
built from it (agentrl.training.untrained)."""

from __future__ import annotations

import math

from agentrl.rewards.unscored import Unscored, why_unscored
from agentrl.testing import make_trajectory
from agentrl.training.untrained import UntrainedSteps, describe

ASKED = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def episode(task_id: int, env_return: float = 0.0, **info: object):
    trajectory = make_trajectory(ASKED, {"id": task_id, "question": f"Q{task_id}"}, info=dict(info))
    trajectory.turns[0].reward = env_return
    return trajectory


def test_each_cause_is_counted_and_the_first_failure_named():
    episodes = [
        episode(0, 1.0),  # scored
        episode(1, error={"method": "agent", "exception": "KeyError: 'x'", "timed_out": False}),
        episode(2, error={"method": "MyEnv.step", "exception": "no result within 1 s", "timed_out": True}),
        episode(3, math.nan),
        episode(4, math.inf),
        episode(5, 0.5),  # its env return is finite, but no reward function scored it
        episode(6, error="verifier crashed"),  # an env that reports its error as text
    ]
    totals = [1.0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan]
    why = why_unscored(episodes, totals, errors={"judge": 1, "format": 0}, nonfinite={"env": 2, "judge": 0})
    assert (why.episodes, why.scored, why.unscored) == (7, 1, 6)
    assert (why.raised, why.timed_out, why.nonfinite_return, why.no_reward) == (2, 1, 2, 1)
    assert why.first == "agent raised on sample 1 (task 1: 'Q1'): KeyError: 'x'"
    assert why.describe() == (
        "7 episodes: 2 raised, 1 timed out, 2 returned a non-finite reward (1 inf, 1 nan), 1 got no finite reward from any "
        "reward function (judge failed on 1); first: agent raised on sample 1 (task 1: 'Q1'): KeyError: 'x'"
    )


def test_the_first_failure_of_each_kind_in_words():
    def first(trajectory) -> str:
        return why_unscored([trajectory], [math.nan]).first

    assert first(episode(0, error={"method": "Game.reset", "timed_out": True})) == (
        "Game.reset timed out on sample 0 (task 0: 'Q0')"
    )
    assert first(episode(0, error="boom")) == "sample 0 (task 0: 'Q0') ended with an error: boom"
    assert first(episode(0, -math.inf)) == "sample 0 (task 0: 'Q0') returned reward -inf"
    assert first(episode(0, 1.0)) == "no reward function gave sample 0 (task 0: 'Q0') a finite reward"


def test_all_scored_adds_up_and_round_trips_through_metrics():
    scored = why_unscored([episode(0, 1.0), episode(1, 0.0)], [1.0, 0.0])
    assert scored.describe() == "2 episodes, all scored" and scored.causes() == ""
    assert scored.metrics("train/") == {"train/episodes_scored": 2.0, "train/episodes_unscored": 0.0}
    failed = why_unscored([episode(2, error={"method": "agent", "exception": "E"})], [math.nan])
    rows = [scored.metrics("train/"), failed.metrics("train/"), {"loss/total": 0.1}]  # a row without counts adds 0
    total = Unscored.from_metrics(rows, "train/")
    assert (total.episodes, total.scored, total.raised, total.first) == (3, 2, 1, "")  # metrics hold no text
    assert Unscored().add(scored).add(failed).first == failed.first


def test_untrained_steps_name_the_streak_and_the_run():
    raised = why_unscored([episode(0, error={"method": "agent", "exception": "E"})] * 2, [math.nan] * 2)
    steps = UntrainedSteps()
    steps.record(1, True)
    steps.record(2, False, raised)
    steps.record(3, False)  # a non-finite loss or gradient
    assert describe(steps.streak) == (
        "1 had no scored episode (2 episodes: 2 raised; first: agent raised on sample 0 (task 0: 'Q0'): E), "
        "1 had a non-finite loss or gradient"
    )
    stuck = str(steps.stuck_error(3, 2, 2, "RUN"))
    assert stuck.startswith("steps 2-3: 2 steps in a row trained nothing (max_nonfinite_steps=2): 1 had no scored")
    assert "The weights are those after step 1" in stuck
    assert steps.untrained_error(1, "RUN", "kept") is None  # step 1 trained
    untrained = UntrainedSteps()
    untrained.record(5, False, raised)
    untrained.record(6, False, raised)
    assert str(untrained.untrained_error(5, "RUN", "no model/ was saved")) == (
        "steps 5-6 since the resume trained nothing: 2 of 2 steps had no scored episode (4 episodes: 4 raised; "
        "first: agent raised on sample 0 (task 0: 'Q0'): E). Fix the cause and train again (on_call_error=fail "
        "stops a run at its first failing call); no model/ was saved in RUN"
    )
