"""plugins.openai_agent.timeout_s limits the agent's own time: waits for a slow engine do not count."""

from __future__ import annotations

import time

import pytest

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model

TWO_CALLS = """
import time

def solve(task, client):
    for _ in range(2):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}],
                                       max_tokens=2)
        time.sleep(task["think_s"])
    return 1.0
"""


class SlowEngine:
    """The real hf engine on the tiny model, each generate call 1.2 s slower (a loaded machine)."""

    def __init__(self, tokenizer):
        factory = load_plugins().registry.get("engine", "hf").factory
        self.inner = factory(
            model=build_tiny_model(len(tokenizer)),
            tokenizer=tokenizer,
            config=TrainConfig(engine_args={"dtype": "float32"}),
        )

    def generate(self, prompts, sampling):
        time.sleep(1.2)
        return self.inner.generate(prompts, sampling)


def _run(tokenizer, tmp_path, think_s: float):
    path = tmp_path / "agent.py"
    path.write_text(TWO_CALLS)
    config = TrainConfig(max_new_tokens=2, plugins={"openai_agent": {"agent": f"{path}:solve", "timeout_s": 0.8}})
    rollout = (
        load_plugins()
        .registry.get("rollout", "openai_agent")
        .factory(engine=SlowEngine(tokenizer), tokenizer=tokenizer, config=config)
    )
    started = time.monotonic()
    [trajectory] = rollout.run([None], [{"question": "q", "think_s": think_s}], [0], SamplingParams(seed=0))
    return trajectory, time.monotonic() - started


def test_waits_for_the_model_do_not_count_against_timeout_s(tokenizer, tmp_path):
    trajectory, wall = _run(tokenizer, tmp_path, think_s=0.1)
    assert wall > 2.4  # two calls of >= 1.2 s each: far past the 0.8 s limit in wall time
    assert "error" not in trajectory.info and trajectory.env_return == 1.0 and trajectory.info["agent_calls"] == 2


def test_the_agents_own_time_past_timeout_s_ends_the_episode(tokenizer, tmp_path):
    with pytest.warns(RuntimeWarning, match="timed out"):
        trajectory, _ = _run(tokenizer, tmp_path, think_s=1.0)  # its own code sleeps 2 x 1 s
    assert trajectory.info["error"]["timed_out"] is True and "own time" in trajectory.info["error"]["exception"]
