"""Rollout wall time when the env is slow: env calls one after another vs at once, side by side.

    python bench/env_latency.py [--episodes 32] [--turns 4] [--latency 0 0.2 1.0] [--workers 1 8 32]

An env whose ``reset`` and every ``step`` sleep L seconds (a sandbox, a web call, a database) drives
``--episodes`` episodes of ``--turns`` model turns each through the registered ``multi_turn`` rollout on
the default model (hf engine, float32, T=1, a fixed seed, 24 new tokens a turn). ``env_workers=1`` is
the old loop (every env call one after another); larger values run a turn's env calls at once.

For each L and worker count it prints the rollout's wall time, the time the engine spent generating
(the same run at L=0), and the env latency the run could not hide (wall - generation) against the
two bounds: all calls serial (episodes x (turns + 1) x L) and one episode's chain ((turns + 1) x L).
Every configuration samples the same tokens (checked: same seeds, results gathered in episode order).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from agentrl import Env, SamplingParams
from agentrl.config import TrainConfig
from agentrl.models import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.plugins import load_plugins

QUESTIONS = ["What is 17 + 25?", "Name a prime above 50.", "Count down from 9.", "Spell 'agent' backwards."]


class SlowChat(Env):
    """``turns`` model turns; each ``reset``/``step`` first sleeps ``latency`` seconds."""

    def __init__(self, latency: float, turns: int) -> None:
        super().__init__()
        self.latency, self.max_turns = latency, turns

    def train_tasks(self) -> list[dict[str, Any]]:
        return [{"id": f"q{i}", "question": q} for i, q in enumerate(QUESTIONS)]

    eval_tasks = train_tasks

    def reset(self, *, seed=None, options=None):
        time.sleep(self.latency)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.latency)
        return super().step(action)

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        done = self.turn >= self.max_turns
        follow_up = [] if done else [{"role": "user", "content": "Check that answer once more, briefly."}]
        return follow_up, float(len(text) > 0), done, {}


def timed_rollout(rollout: Any, latency: float, turns: int, episodes: int) -> tuple[float, list]:
    """Seconds for one rollout of ``episodes`` SlowChat episodes, and their token ids."""
    envs = [SlowChat(latency, turns) for _ in range(episodes)]
    tasks = [envs[0].train_tasks()[i % len(QUESTIONS)] for i in range(episodes)]
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0, seed=0)
    start = time.perf_counter()
    trajectories = rollout.run(envs, tasks, [i // 8 for i in range(episodes)], sampling,
                               seeds=list(range(episodes)))
    return time.perf_counter() - start, [t.token_ids for t in trajectories]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.2, 1.0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    console = Console(width=150)
    torch.manual_seed(0)
    tokenizer, model = load_tokenizer(DEFAULT_MODEL), load_model(DEFAULT_MODEL)
    manager = load_plugins()
    engine = manager.registry.get("engine", "hf").factory(
        model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"}))

    def rollout_with(workers: int) -> Any:
        config = TrainConfig(env_workers=workers, max_new_tokens=24, call_timeout_s=600.0)
        return manager.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer,
                                                                     config=config)

    timed_rollout(rollout_with(1), 0.0, 1, 8)  # warm-up
    generation_s, reference = timed_rollout(rollout_with(1), 0.0, args.turns, args.episodes)
    table = Table(title=f"{args.episodes} episodes x {args.turns} turns, default model, hf float32, "
                        f"{torch.get_num_threads()} threads (generation alone: {generation_s:.1f} s)")
    for column in ("L (s)", "env_workers", "wall (s)", "wall - generation (s)", "serial bound (s)",
                   "one chain (s)", "same tokens"):
        table.add_column(column, justify="right")
    for latency in args.latency:
        for workers in args.workers:
            wall, tokens = timed_rollout(rollout_with(workers), latency, args.turns, args.episodes)
            calls = args.turns + 1
            table.add_row(f"{latency:g}", str(workers), f"{wall:.1f}", f"{wall - generation_s:.1f}",
                          f"{args.episodes * calls * latency:.1f}", f"{calls * latency:.1f}",
                          "yes" if tokens == reference else "NO")
            console.print(f"L={latency:g} env_workers={workers}: {wall:.1f} s")
    console.print(table)


if __name__ == "__main__":
    main()
