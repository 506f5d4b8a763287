"""``--resume`` of a Ray run after ``kill -9`` of ``agentrl train`` while the episodes of later
steps are in flight (``async_steps=2``, an engine replica and an env worker on their own nodes)
equals the straight Ray run bit for bit: metrics, completions, weights (the one-host version of
this test: tests/training/test_async_training.py)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

_spec = importlib.util.spec_from_file_location(
    "async_runs", Path(__file__).parents[1] / "training" / "test_async_training.py"
)
assert _spec is not None and _spec.loader is not None
async_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(async_runs)


def test_kill_9_with_episodes_in_flight_on_ray_then_resume_equals_straight(ray_cluster, tiny_model_dir, tmp_path):
    plugin = tmp_path / "slow_rollout.py"
    plugin.write_text(async_runs.SLOW_ROLLOUT_PLUGIN)
    cli = [sys.executable, "-m", "agentrl.cli.app", "train"]
    common = [
        *("--model", str(tiny_model_dir), "--max-steps", "6", "--num-generations", "3", "--prompts-per-step", "2"),
        *("--reward", "agentrl.testing:parity_reward", "--plugin", str(plugin), *async_runs.LOCKSTEP_ARGS),
        *("--ray", "--set", f"ray.address={ray_cluster.address}"),
    ]
    for item in (
        "max_new_tokens=8",
        "eval_tasks=0",
        "checkpoint_every=2",
        "async_steps=2",
        "learning_rate=0.01",
        "log_completions_every=1",
        "ray.engines=1",
        "ray.engine_resources={CPU: 1, engine: 1}",
        "ray.env_workers=1",
        "ray.env_worker_resources={CPU: 1, env: 1}",
    ):
        common += ["--set", item]
    straight, killed, ready = tmp_path / "straight", tmp_path / "killed", tmp_path / "ready"
    first = subprocess.Popen(
        [*cli, *common, "--output-dir", str(straight)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc = subprocess.Popen(
        [*cli, *common, "--output-dir", str(killed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTRL_TEST_SLOW_ROLLOUT": str(ready)},
    )
    deadline = time.monotonic() + 300
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1][-3000:]
    time.sleep(1.0)  # the learner goes on meanwhile: steps 3 and 4 train on what was collected ahead
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    done = subprocess.run(
        [*cli, "--resume", str(killed), "--plugin", str(plugin)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step-000002" in done.stdout and "on Ray" in done.stdout  # resumed from step 2, on Ray again
    async_runs._assert_same_run(straight, killed)
