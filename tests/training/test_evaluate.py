"""agentrl.training.evaluate: what counts as a solved episode (``episode_success``): the env's
``info["success"]``, else ``info["correct"]``, else its return reaching the env's ``success_threshold``
(a game whose return scores a lost game in (0, 1) is not solved)."""

from __future__ import annotations

import pytest

from agentrl import Env
from agentrl.testing import make_trajectory
from agentrl.training.evaluate import episode_success


class ScoredGame(Env):
    """A game whose return scores a lost game in (0, 1) and sets no success flag."""

    def train_tasks(self):
        return [{"question": "play"}]

    def eval_tasks(self):
        return self.train_tasks()

    def start(self, task):
        return [{"role": "user", "content": "play"}]

    def respond(self, text):
        return [], 0.4, True, {}


def episode(env_return: float, **info: object):
    """A one-turn episode whose env return is ``env_return``, with ``info`` as its final info."""
    trajectory = make_trajectory(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], {}, info=dict(info)
    )
    trajectory.turns[0].reward = env_return
    return trajectory


def test_a_scored_but_lost_game_is_not_a_success() -> None:
    lost, won = episode(0.4), episode(1.0)
    assert lost.env_return == pytest.approx(0.4) and won.env_return == pytest.approx(1.0)
    assert not episode_success(lost, ScoredGame.success_threshold)  # return > 0 used to count as solved
    assert episode_success(won, ScoredGame.success_threshold)
    assert episode_success(lost, success_threshold=0.3)  # an env may lower its bar
    assert episode_success(episode(0.4, success=True))  # info["success"] wins over the return
    assert not episode_success(episode(1.0, correct=False))
