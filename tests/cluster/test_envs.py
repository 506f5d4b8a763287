"""Env workers as Ray actors (``ray.env_workers``) on the simulated multi-node cluster: placed on
the env node by resources, stand-ins answering as the local envs do (built-in, multi-turn and
``file.py:Class`` envs), env errors re-raised as they were, a worker killed in the middle of a
step restarted and its episode replayed, one line when the env cannot be built on a worker or a
worker is gone for good, and a short training run that equals the same run without Ray."""

from __future__ import annotations

import inspect
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from agentrl.cluster.envs import REPLAYED, RESTARTS, EnvWorkerLost, RemoteEnv, RemoteEnvs
from agentrl.config.cluster import RayConfig
from agentrl.config.train import TrainConfig
from agentrl.env import CallGuard, call_with_timeout
from agentrl.errors import ConfigError
from agentrl.plugins import load_plugins

ON_ENV_NODE = {"CPU": 1, "env": 1}

COUNTER_ENV = '''
import time

from agentrl import Env


class Counter(Env):
    """Observations depend on the reset's seed (its RNG), the task and every action so far."""

    max_turns = 6

    def train_tasks(self):
        return [{"id": f"t{i}", "question": f"count from {i}", "start": i} for i in range(8)]

    def eval_tasks(self):
        return [{"id": "e0", "question": "count from 0", "start": 0}]

    def start(self, task):
        self.total = task["start"] + int(self.np_random.integers(1000))
        return [{"role": "user", "content": f"{task['question']} ({self.total})"}]

    def respond(self, text):
        if text == "boom":
            raise ValueError(f"boom at turn {self.turn}")
        if text.startswith("slow"):
            time.sleep(0.5)
        self.total = self.total * 31 + len(text)
        reward = (self.total % 7) / 7
        return [{"role": "user", "content": f"total {self.total}"}], reward, False, {"total": self.total}


class AsyncCounter(Counter):
    """The same, with ``async def`` episode methods."""

    async def reset(self, *, seed=None, options=None):
        return Counter.reset(self, seed=seed, options=options)

    async def step(self, action):
        return Counter.step(self, action)
'''

ACTIONS = ["a", "bb", "slow ccc", "dddd"]


@pytest.fixture
def counter_file(tmp_path: Path) -> Path:
    path = tmp_path / "counter_env.py"
    path.write_text(COUNTER_ENV)
    return path


def pool_of(env: str, address: str, count: int = 2, workers: int = 2, **ray: Any) -> tuple[list[Any], RemoteEnvs]:
    """``count`` local instances of ``env`` and a RemoteEnvs of ``workers`` on the env node."""
    manager = load_plugins()
    config = TrainConfig(env=env)
    if ":" in env:
        from agentrl.env import load_env_class

        factory = load_env_class(env)
    else:
        factory = manager.registry.get("env", env).factory
    envs = [factory() for _ in range(count)]
    options = {"address": address, "env_workers": workers, "env_worker_resources": ON_ENV_NODE, **ray}
    return envs, RemoteEnvs(envs, config, RayConfig(**options))


def episode(env: Any, task: dict[str, Any], actions: list[str], seed: int = 5) -> list[Any]:
    """What ``reset`` and each step answer, in order (``async def`` ones run to completion)."""
    reset = call_with_timeout(env.reset, None, seed=seed, options={"task": task})
    return [reset, *(call_with_timeout(env.step, None, action) for action in actions)]


def test_workers_are_placed_on_the_env_node(ray_cluster):
    envs, pool = pool_of("math", ray_cluster.address, count=3)
    try:
        assert [ray_cluster.name_of(node) for node in pool.worker_nodes()] == ["env", "env"]
        assert pool.description.startswith(f"env workers: 2 on node {ray_cluster.node_ids['env'][:6]}")
        assert [env.remote_slot for env in pool.envs] == [(0, 0), (1, 1), (0, 2)]  # round-robin
        assert pool.counts() == {RESTARTS: 0.0, REPLAYED: 0.0}
    finally:
        pool.close()


@pytest.mark.parametrize("name", ["math", "guess", "calculator"])
def test_stand_ins_answer_as_the_local_envs(ray_cluster, name):
    envs, pool = pool_of(name, ray_cluster.address)
    try:
        local, remote = envs[1], pool.envs[1]
        assert type(remote).__name__ == type(local).__name__ and isinstance(remote, type(local))
        assert isinstance(remote, RemoteEnv)
        assert remote.max_turns == local.max_turns and remote.tool_schemas() == local.tool_schemas()
        task = local.train_tasks()[3]
        gold = local.gold_reply(task)
        replies = gold if isinstance(gold, list) else ["\\boxed{1}", "<guess>4</guess>", "7"]
        expected = episode(local, task, replies)
        assert episode(remote, task, replies) == expected
        assert remote.turn == 0 and remote.task is None  # episode state lives on the worker
    finally:
        pool.close()


def test_an_env_from_a_file_runs_on_a_worker_and_its_errors_come_back_as_raised(ray_cluster, counter_file, monkeypatch):
    monkeypatch.chdir(counter_file.parent)  # a relative path: the worker gets it made absolute
    for name in ("Counter", "AsyncCounter"):
        envs, pool = pool_of(f"{counter_file.name}:{name}", ray_cluster.address, count=1, workers=1)
        assert pool.spec.env == f"{counter_file}:{name}"
        try:
            task = envs[0].train_tasks()[2]
            remote = pool.envs[0]
            assert inspect.iscoroutinefunction(remote.step) == (name == "AsyncCounter")
            assert episode(remote, task, ["a", "bb"]) == episode(envs[0], task, ["a", "bb"])
            with pytest.raises(ValueError, match="^boom at turn 3$"):
                CallGuard(timeout_s=30).call(remote.step, "boom")
            fresh = pool.fresh(0)  # a slot of its own, as for a slot whose call was abandoned
            assert fresh is pool.envs[0] and fresh.remote_slot == (0, 1)
            assert episode(fresh, task, ["a"], seed=9) == episode(envs[0], task, ["a"], seed=9)
        finally:
            pool.close()


def test_an_env_the_worker_cannot_import_is_one_line_at_start_up(ray_cluster, tmp_path, monkeypatch):
    here_only = tmp_path / "here_only"
    here_only.mkdir()
    (here_only / "helper_here_only.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(here_only))  # importable in this process only, not on the env node
    env_file = tmp_path / "needs_helper.py"
    env_file.write_text("import helper_here_only\n" + COUNTER_ENV)
    with pytest.raises(ConfigError) as caught:
        pool_of(f"{env_file}:Counter", ray_cluster.address, count=1, workers=1)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"ray.env_workers: env worker 0 on node {ray_cluster.node_ids['env'][:6]}")
    assert "helper_here_only" in message


def test_a_worker_killed_during_a_step_is_restarted_and_the_episode_replayed(ray_cluster, counter_file):
    envs, pool = pool_of(f"{counter_file}:Counter", ray_cluster.address, count=2)
    try:
        task = envs[0].train_tasks()[1]
        expected = episode(envs[0], task, ACTIONS)
        remote = pool.envs[0]
        worker, _ = remote.remote_slot
        killed_pid = pool.infos[worker].pid
        answers = [remote.reset(seed=5, options={"task": task}), remote.step("a"), remote.step("bb")]
        killer = threading.Timer(0.2, os.kill, (killed_pid, signal.SIGKILL))  # while "slow ccc" runs
        killer.start()
        answers.append(remote.step("slow ccc"))
        killer.join()
        answers.append(remote.step("dddd"))
        assert answers == expected
        assert pool.infos[worker].pid != killed_pid
        assert pool.counts() == {RESTARTS: 1.0, REPLAYED: 4.0}  # reset + 2 steps replayed, the step made again
        other = pool.envs[1]  # its worker was not killed: it answers as before
        assert episode(other, task, ["a"]) == episode(envs[1], task, ["a"])
        assert pool.counts() == {RESTARTS: 0.0, REPLAYED: 0.0}
    finally:
        pool.close()


def test_a_worker_gone_for_good_fails_the_call_in_one_line(ray_cluster, counter_file):
    envs, pool = pool_of(f"{counter_file}:Counter", ray_cluster.address, count=1, workers=1, max_restarts=0)
    try:
        remote = pool.envs[0]
        remote.reset(seed=1, options={"task": envs[0].train_tasks()[0]})
        os.kill(pool.infos[0].pid, signal.SIGKILL)
        with pytest.raises(EnvWorkerLost) as caught:
            CallGuard(timeout_s=60).call(remote.step, "a")
        message = str(caught.value)
        assert "\n" not in message and len(message) <= 200  # whole inside the rollout's one-line error
        assert message.startswith(f"env worker 0 on node {ray_cluster.node_ids['env'][:6]}")
        assert "max_restarts=0 spent" in message and "died" in message
    finally:
        pool.close()


def _train(tiny_model_dir: Path, out: Path, ray: dict[str, Any] | None) -> tuple[list[dict[str, float]], list[Any]]:
    """A 2-step multi-turn run on the guess env: its metrics rows and completions."""
    from agentrl.training.trainer import Trainer

    config = TrainConfig(
        model=str(tiny_model_dir),
        env="guess",
        env_args={"n": 8, "max_turns": 2},
        rewards={"agentrl.testing:parity_reward": 1.0},  # rewards that differ: the steps train
        max_steps=2,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=4,
        eval_tasks=0,
        output_dir=str(out),
        log_completions_every=1,
        precision="fp32",
        engine_args={"dtype": "float32"},
        checkpoint_every=0,
        save_model=False,
        ray=ray,
    )
    trainer = Trainer(config, load_plugins())
    assert isinstance(trainer.envs[0], RemoteEnv) == (ray is not None)
    try:
        result = trainer.train()
    finally:
        stand_in = trainer.envs[0]
        if isinstance(stand_in, RemoteEnv):
            stand_in.remote_pool.close()
    completions = [json.loads(line) for line in (result.run_dir / "completions.jsonl").read_text().splitlines()]
    return result.history, completions


def test_a_training_run_with_env_workers_equals_the_run_without(ray_cluster, tiny_model_dir, tmp_path):
    ray = {"address": ray_cluster.address, "env_workers": 2, "env_worker_resources": ON_ENV_NODE}
    with_ray, with_ray_completions = _train(tiny_model_dir, tmp_path / "ray", ray)
    alone, alone_completions = _train(tiny_model_dir, tmp_path / "alone", None)

    def compared(rows: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in row.items() if not k.startswith(("perf/", "faults/", "time"))} for row in rows]

    assert len(with_ray) == 2 and compared(with_ray) == compared(alone)
    assert with_ray_completions == alone_completions
    assert all(row[RESTARTS] == 0 and row[REPLAYED] == 0 for row in with_ray)
    assert max(len(c["messages"]) for c in alone_completions) > 3  # episodes of more than one turn
    assert any(row["train/grad_norm"] > 0 for row in alone)
