"""Steps per hour of a multi-turn run on a Ray cluster whose env calls are slow: 1, 2 and 4
env-worker nodes, and 1 vs 2 engine replicas.

    python bench/cluster_throughput.py [--latency 1.0] [--slots 4] [--steps 3] [--tiny]

A real multi-node cluster on this host (``ray.cluster_utils.Cluster``: a head node, four env nodes
with ``{env: 1}`` each, two engine nodes with ``{engine: 1}`` each) trains the default model with
GRPO on ``bench/slow_guess.py:SlowGuess`` (the guess env, every ``reset``/``step`` sleeping
``--latency`` seconds: a sandbox, a browser, a web call), 4 tasks x 4 episodes of up to 3 turns a
step, through ``agentrl train --ray``. Each env worker holds ``--slots`` envs at once
(``ray.env_worker_slots``: the sandboxes a node holds), so one node makes at most that many calls
at a time. For each configuration it prints steps/hour (from the steps after the first), the mean
rollout and update seconds, and the env-bound floor of a rollout: ceil(episodes / (nodes x slots))
x (turns + 1) x latency. ``--tiny``: a random tiny model, 0.05 s latency, two configurations
(proves the script runs; figures meaningless).

On one 2-core host every node shares the same two cores: more env nodes help as long as the env
calls wait (latency), not while they compute; a second engine replica cannot sample faster than
the cores the first one already uses.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
ENV = f"{HERE / 'slow_guess.py'}:SlowGuess"
EPISODES, TURNS = (4, 4), 3


def start_cluster() -> object:
    """Head + four env nodes + two engine nodes, on this host."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    for _ in range(4):
        cluster.add_node(num_cpus=8, resources={"env": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={"engine": 1})
    cluster.wait_for_nodes()
    return cluster


def train(address: str, model: str, out: Path, env_nodes: int, engines: int, args: argparse.Namespace) -> list[dict]:
    """One ``agentrl train --ray`` run; its metrics rows."""
    sets = {
        "ray.address": address,
        "ray.env_workers": env_nodes,
        "ray.env_worker_resources": "{CPU: 1, env: 1}",
        "ray.env_worker_slots": args.slots,
        "ray.engines": engines,
        "ray.engine_resources": "{CPU: 1, engine: 1}",
        "env_args.latency_s": args.latency,
        "env_args.max_turns": TURNS,
        "max_new_tokens": 16,
        "eval_tasks": 0,
        "checkpoint_every": 0,
        "save_model": "false",
        "log_completions_every": 0,
    }
    command = [sys.executable, "-m", "agentrl", "train", "--env", ENV, "--algo", "grpo", "--model", model, "--ray"]
    command += ["--max-steps", str(args.steps), "--prompts-per-step", str(EPISODES[0])]
    command += ["--num-generations", str(EPISODES[1]), "--output-dir", str(out)]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        raise SystemExit(f"run failed ({env_nodes} env nodes, {engines} engines):\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=1.0, help="seconds every reset/step sleeps")
    parser.add_argument("--slots", type=int, default=4, help="env calls one env worker makes at once")
    parser.add_argument("--steps", type=int, default=3, help="steps per run (the first is not timed)")
    parser.add_argument("--tiny", action="store_true", help="a random tiny model, 0.05 s, two configurations")
    args = parser.parse_args()
    configurations = [(1, 1), (2, 1), (4, 1), (4, 2)]
    with tempfile.TemporaryDirectory() as scratch:
        model = "smollm2-135m"
        if args.tiny:
            args.latency, args.steps, configurations = 0.05, 2, [(1, 1), (2, 2)]
            model = tiny_model(Path(scratch) / "tiny")
        cluster = start_cluster()
        table = Table(title=f"{EPISODES[0]}x{EPISODES[1]} episodes, {TURNS} turns, {args.latency:g} s per env call")
        for column in ("env nodes", "engines", "steps/hour", "rollout s", "update s", "env floor s"):
            table.add_column(column, justify="right")
        try:
            for env_nodes, engines in configurations:
                rows = train(
                    cluster.address, model, Path(scratch) / f"run-{env_nodes}-{engines}", env_nodes, engines, args
                )
                timed = rows[1:] or rows
                step = sum(r["perf/step_seconds"] for r in timed) / len(timed)
                floor = math.ceil(EPISODES[0] * EPISODES[1] / (env_nodes * args.slots)) * (TURNS + 1) * args.latency
                figures = (
                    3600 / step,
                    sum(r["perf/rollout_seconds"] for r in timed) / len(timed),
                    sum(r["perf/update_seconds"] for r in timed) / len(timed),
                    floor,
                )
                print(f"env_nodes={env_nodes} engines={engines}: " + " ".join(f"{f:.1f}" for f in figures), flush=True)
                table.add_row(str(env_nodes), str(engines), *(f"{f:.1f}" for f in figures))
        finally:
            cluster.shutdown()
    Console().print(table)


def tiny_model(folder: Path) -> str:
    """A random 2-layer model with the default tokenizer, saved to ``folder``."""
    from agentrl.model.loading import DEFAULT_MODEL, load_tokenizer
    from agentrl.testing import build_tiny_model

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


if __name__ == "__main__":
    main()
