"""A script-style agent (``run_agent(question, base_url, model=..., max_turns=...)`` returning its
answer) runs in Ray env worker actors as it does locally: the actors' workers are given how to call it."""

from __future__ import annotations

import json

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model

SCRIPT = """
import json
import os

import openai


def run_agent(question: str, base_url: str, model: str = "gpt-4o-mini", max_turns: int = 5) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="x")
    for _ in range(max_turns):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
    return json.dumps({"question": question, "model": model, "max_turns": max_turns, "pid": os.getpid()})
"""


def test_a_script_agent_runs_in_the_remote_workers_with_its_arguments(ray_cluster, tokenizer, tmp_path):
    agent = tmp_path / "script_agent.py"
    agent.write_text(SCRIPT)
    plugins = load_plugins()
    engine = plugins.registry.get("engine", "hf").factory(
        model=build_tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        config=TrainConfig(engine_args={"dtype": "float32"}),
    )
    ray = {"address": ray_cluster.address, "env_workers": 1, "env_worker_resources": {"CPU": 1, "env": 1}}
    config = TrainConfig(
        model="remote-policy",
        max_new_tokens=4,
        ray=ray,
        plugins={"openai_agent": {"agent": f"{agent}:run_agent", "max_turns": 2}},
    )
    rollout = plugins.registry.get("rollout", "openai_agent").factory(engine=engine, tokenizer=tokenizer, config=config)
    tasks = [{"question": "What is 1 + 2?", "answer": "3"}, {"question": "What is 2 + 2?", "answer": "4"}]
    try:
        trajectories = rollout.run([None, None], tasks, [0, 1], SamplingParams(max_new_tokens=4, seed=0))
        workers = set(rollout.workers.pids())
    finally:
        rollout.close()
    answers = [json.loads(t.completion_text) for t in trajectories]
    assert [(a["question"], a["model"], a["max_turns"]) for a in answers] == [
        (task["question"], "remote-policy", 2) for task in tasks
    ]
    assert {a["pid"] for a in answers} <= workers  # run in the actors' worker processes
    assert [t.info["agent_calls"] for t in trajectories] == [2, 2]
