"""The ``openai_agent`` rollout's agent programs in Ray env worker actors (``ray.env_workers``) on
the simulated multi-node cluster: placed on the env node, checked to reach the endpoint before the
first step, an episode whose actor dies run again on the restarted one, and a training run equal
to the one without Ray."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agentrl import ConfigError, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model

ON_ENV_NODE = {"CPU": 1, "env": 1}

AGENT = """\
import json, os, signal, time

import psutil


def _first(mark):  # True in the one program that creates mark (atomic: both actors' episodes run at once)
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def solve(task, client):
    log = os.environ.get("AGENT_LOG")
    if log:  # where this agent program runs: its process and the processes above it
        ancestors = [parent.pid for parent in psutil.Process().parents()]
        with open(log, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "ancestors": ancestors}) + "\\n")
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    mark = os.environ.get("AGENT_KILL_MARK")
    if mark and _first(mark):  # once: the worker actor hosting this program dies mid-episode
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
    return float(len(reply.choices[0].message.content) % 2)
"""


def _raylet_pids(ray_cluster) -> dict[str, int]:
    """Node name -> the pid of its raylet (each Ray worker process is started by its node's raylet)."""
    pids = {}
    for node in ray_cluster.cluster.list_all_nodes():
        raylet = node.all_processes["raylet"][0].process
        pids[ray_cluster.name_of(node.node_id)] = raylet.pid
    return pids


def _rollout(tokenizer, agent: str, ray: dict[str, Any], **options):
    plugins = load_plugins()
    engine = plugins.registry.get("engine", "hf").factory(
        model=build_tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        config=TrainConfig(engine_args={"dtype": "float32"}),
    )
    config = TrainConfig(max_new_tokens=4, ray=ray, plugins={"openai_agent": {"agent": agent, **options}})
    return plugins.registry.get("rollout", "openai_agent").factory(engine=engine, tokenizer=tokenizer, config=config)


def test_an_endpoint_the_agent_workers_cannot_reach_is_one_line_naming_the_node_and_url(
    ray_cluster, tokenizer, tmp_path
):
    agent = tmp_path / "agent.py"
    agent.write_text("def solve(task, client):\n    return 1.0\n")
    ray = {"address": ray_cluster.address, "env_workers": 1, "env_worker_resources": ON_ENV_NODE}
    rollout = _rollout(tokenizer, f"{agent}:solve", ray, host="127.0.0.1", advertise_host="127.0.0.2")
    try:
        with pytest.raises(ConfigError) as caught:
            rollout.run([None], [{"question": "q"}], [0], SamplingParams(max_new_tokens=4, seed=1))
        assert rollout.workers.places[0]["node"] == ray_cluster.node_ids["env"]
    finally:
        rollout.close()
    line = str(caught.value)
    assert "\n" not in line, line
    assert line.startswith(f"openai_agent: agent worker 0 on node {ray_cluster.node_ids['env'][:6]} "), line
    assert "cannot reach the endpoint at http://127.0.0.2:" in line and "/<run-secret>/health" in line, line
    assert rollout.secret not in line and "refused" in line.lower() and "advertise_host" in line, line


def _train(tiny_model_dir: Path, out: Path, ray: dict[str, Any] | None, agent: str) -> tuple[list[dict], list]:
    """A 2-step GRPO run of the agent on the math env: its metrics rows and completions."""
    from agentrl.training.trainer import Trainer

    config = TrainConfig(
        model=str(tiny_model_dir),
        env="math",
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(out),
        log_completions_every=1,
        precision="fp32",
        engine_args={"dtype": "float32"},
        checkpoint_every=0,
        save_model=False,
        rollout="openai_agent",
        plugins={"openai_agent": {"agent": agent}},
        ray=ray,
    )
    trainer = Trainer(config, load_plugins())
    try:
        result = trainer.train()
    finally:
        trainer.run.rollout.close()
        pool = getattr(trainer.run.envs[0], "remote_pool", None)
        if pool is not None:
            pool.close()
    completions = [json.loads(line) for line in (result.run_dir / "completions.jsonl").read_text().splitlines()]
    return result.history, completions


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-5 (an episode run again is sampled in other batches: logprobs to rounding)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_training_run_with_agents_on_the_env_node_equals_the_run_without_ray(ray_cluster, tiny_model_dir, tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    log, mark = tmp_path / "where.jsonl", tmp_path / "killed"
    ray = {
        "address": ray_cluster.address,
        "env_workers": 2,
        "env_worker_resources": ON_ENV_NODE,
        "runtime_env": {"env_vars": {"AGENT_LOG": str(log), "AGENT_KILL_MARK": str(mark)}},
    }
    with_ray, with_ray_completions = _train(tiny_model_dir, tmp_path / "ray", ray, f"{agent}:solve")
    alone, alone_completions = _train(tiny_model_dir, tmp_path / "alone", None, f"{agent}:solve")

    def compared(rows: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in row.items() if not k.startswith(("perf/", "faults/", "time"))} for row in rows]

    assert len(with_ray) == 2 and _same(compared(with_ray), compared(alone)), (compared(with_ray), compared(alone))
    assert _same(with_ray_completions, alone_completions)
    # one worker actor was killed mid-episode: restarted once, its running episodes run again
    assert mark.exists() and sum(row.get("faults/agent_worker_restarts", 0) for row in with_ray) == 1
    assert sum(row.get("faults/agent_episodes_rerun", 0) for row in with_ray) >= 1
    # every agent program ran on the env node: a process started by that node's raylet
    raylets = _raylet_pids(ray_cluster)
    where = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(where) >= 8  # 2 steps x 4 episodes, the killed one twice
    assert all(raylets["env"] in entry["ancestors"] for entry in where), (raylets, where)
    assert not any(raylets[name] in entry["ancestors"] for entry in where for name in raylets if name != "env")


def test_a_remote_agent_past_its_timeout_is_ended_by_the_trainers_clock(ray_cluster, tokenizer, tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import time\n\n\ndef solve(task, client):\n"
        "    client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}])\n"
        "    time.sleep(float(task['question']))\n    return 1.0\n"
    )
    ray = {"address": ray_cluster.address, "env_workers": 1, "env_worker_resources": ON_ENV_NODE}
    rollout = _rollout(tokenizer, f"{agent}:solve", ray, timeout_s=2.0)
    try:
        slow, quick = rollout.run(
            [None, None], [{"question": "60"}, {"question": "0"}], [0, 1], SamplingParams(max_new_tokens=4, seed=1)
        )
    finally:
        rollout.close()
    assert slow.info["error"]["timed_out"] is True and "timeout_s=2 s" in slow.info["error"]["exception"]
    assert "error" not in quick.info and quick.turns[-1].reward == 1.0
    assert rollout.counts() == {"faults/agent_worker_restarts": 0.0, "faults/agent_episodes_rerun": 0.0}
