"""The ``guess`` env with a fixed latency on every ``reset`` and ``step`` (a sandbox, a browser, a
web call): what ``bench/cluster_throughput.py`` trains on. ``--env bench/slow_guess.py:SlowGuess
--set env_args.latency_s=1.0``."""

from __future__ import annotations

import time
from typing import Any

from agentrl_guess import GuessEnv


class SlowGuess(GuessEnv):
    """:class:`agentrl_guess.GuessEnv` whose ``reset`` and ``step`` first sleep ``latency_s`` seconds."""

    def __init__(self, latency_s: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.latency_s = latency_s

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        time.sleep(self.latency_s)
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        time.sleep(self.latency_s)
        return super().step(action)
