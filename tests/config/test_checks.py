"""agentrl.config.checks: a config value against its field's type hint, one error naming the key
(reward weights and ``env_reward_weight`` must be finite numbers)."""

from __future__ import annotations

import math
import re

import pytest

from agentrl import ConfigError
from agentrl.config.train import TrainConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rewards": {"format": math.inf}}, "rewards.format must be a finite number, got inf"),
        ({"rewards": {"format": math.nan}}, "rewards.format must be a finite number, got nan"),
        ({"env_reward_weight": -math.inf}, "env_reward_weight must be a finite number, got -inf"),
    ],
)
def test_non_finite_reward_weights_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**kwargs)
