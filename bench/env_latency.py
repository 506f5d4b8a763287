"""Rollout wall time when the env is slow: the lockstep loop (env calls one after another, or at
once) against episodes that advance on their own, side by side.

    python bench/env_latency.py [--episodes 32] [--turns 4] [--latency 0 0.2 1.0] [--workers 32] [--tiny]

An env whose ``reset`` and every ``step`` sleep L seconds (a sandbox, a web call, a database), or a
jittered L (each call sleeps uniform(0, 2L), seeded per episode: some episodes fast, some slow),
drives ``--episodes`` episodes of ``--turns`` model turns each on the default model (hf engine,
float32, T=1, a fixed seed, 24 new tokens a turn) through three loops:

* ``lockstep serial``: the loop before episodes advanced on their own, with ``env_workers=1`` (every env call one after
  another, every episode's turn k sampled together);
* ``lockstep at once``: the same loop, a turn's env calls at once (``--workers``);
* ``per episode``: the registered ``multi_turn`` rollout (each episode asks for its next turn as
  soon as its env answered; ``plugins.multi_turn.batch_wait_s`` default), ``--workers`` env calls.

For each it prints the rollout's wall time, the env latency the run could not hide (wall minus
the generation time of the same run at L=0), the number of engine batches, and against the two
bounds: all calls serial (episodes x (turns + 1) x L) and one episode's chain ((turns + 1) x L).
Every configuration samples the same tokens (checked: per-request seeds). ``--tiny``: a random
2-layer model, 4 episodes x 2 turns, L = 0 and 0.05 (proves the script runs; figures meaningless).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from agentrl import Env, EnvCall, SamplingParams, turn_seed
from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer
from agentrl.plugins import load_plugins
from agentrl.sampling.request_queue import cut
from agentrl.testing import build_tiny_model
from agentrl_rollouts import MultiTurnRollout

QUESTIONS = ["What is 17 + 25?", "Name a prime above 50.", "Count down from 9.", "Spell 'agent' backwards."]


class SlowChat(Env):
    """``turns`` model turns; each ``reset``/``step`` first sleeps ``latency`` seconds, or with
    ``jitter_seed`` a uniform(0, 2 x ``latency``) drawn from a generator of that seed."""

    def __init__(self, latency: float, turns: int, jitter_seed: int | None = None) -> None:
        super().__init__()
        self.mean, self.max_turns = latency, turns
        self.rng = None if jitter_seed is None else random.Random(jitter_seed)

    @property
    def latency(self) -> float:
        """Seconds the next call sleeps."""
        return self.mean if self.rng is None else self.rng.uniform(0, 2 * self.mean)

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


class LockstepRollout(MultiTurnRollout):
    """The ``multi_turn`` loop before episodes advanced on their own: every live episode's turn k sampled in one batch
    (the largest budget, then cut), then every env answers (``env_workers``), then turn k + 1."""

    def _advance(
        self, episodes: list[Any], sampling: SamplingParams, seeds: list[int] | None, max_sampled: int
    ) -> None:
        tools = [self._tools(e.env) for e in episodes]  # every env resets at once, before the first turn
        resets = self.workers.gather([self._reset_call(e, seeds, tools[e.index]) for e in episodes])
        for episode, outcome in zip(episodes, resets):
            self._start(episode, outcome, tools[episode.index])
        turn = 0
        while live := [e for e in episodes if not e.done]:
            budget = [
                min(sampling.max_new_tokens, max_sampled - e.sampled, self.config.max_total_tokens - len(e.token_ids))
                for e in live
            ]
            for episode, cap in zip(live, budget):
                if cap <= 0:
                    episode.done = episode.truncated = True
            live, budget = [e for e in live if not e.done], [b for b in budget if b > 0]
            if not live:
                break
            batch = SamplingParams(
                max_new_tokens=max(budget),
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                seed=turn_seed(sampling.seed, turn),
                prompt_seeds=None if seeds is None else tuple(turn_seed(seeds[e.index], turn) for e in live),
            )
            generations = self.engine.generate([e.token_ids for e in live], batch)
            self.batches.append(len(live))
            replies = [self._sampled(e, cut(g, cap)) for e, g, cap in zip(live, generations, budget)]
            outcomes = self.workers.gather(
                [EnvCall(e.env, "step", (r.assistant["content"],)) for e, r in zip(live, replies)]
            )
            for episode, reply, outcome in zip(live, replies, outcomes):
                self._answered(episode, reply, outcome, max_sampled)
            turn += 1


def timed_rollout(rollout: Any, latency: float, turns: int, episodes: int, jitter: bool = False) -> tuple[float, list]:
    """Seconds for one rollout of ``episodes`` SlowChat episodes, and their token ids."""
    envs = [SlowChat(latency, turns, i if jitter else None) for i in range(episodes)]
    tasks = [envs[0].train_tasks()[i % len(QUESTIONS)] for i in range(episodes)]
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0, seed=0)
    rollout.batches = []
    start = time.perf_counter()
    trajectories = rollout.run(envs, tasks, [i // 8 for i in range(episodes)], sampling, seeds=list(range(episodes)))
    return time.perf_counter() - start, [t.token_ids for t in trajectories]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.2, 1.0])
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="a random tiny model, 4 episodes x 2 turns, L = 0 0.05")
    args = parser.parse_args()
    if args.tiny:
        args.episodes, args.turns, args.latency = 4, 2, [0.0, 0.05]
    console = Console(width=160)
    torch.manual_seed(0)
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    model = build_tiny_model(len(tokenizer)) if args.tiny else load_model(DEFAULT_MODEL)
    engine = (
        load_plugins()
        .registry.get("engine", "hf")
        .factory(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32"}))
    )
    loops = {
        "lockstep serial": (LockstepRollout, 1),
        "lockstep at once": (LockstepRollout, args.workers),
        "per episode": (MultiTurnRollout, args.workers),
    }

    def rollout_with(name: str) -> Any:
        rollout_class, workers = loops[name]
        config = TrainConfig(env_workers=workers, max_new_tokens=24, call_timeout_s=600.0)
        return rollout_class(engine=engine, tokenizer=tokenizer, config=config)

    timed_rollout(rollout_with("lockstep serial"), 0.0, 1, min(8, args.episodes))  # warm-up
    generation_s, reference = timed_rollout(rollout_with("lockstep serial"), 0.0, args.turns, args.episodes)
    table = Table(
        title=f"{args.episodes} episodes x {args.turns} turns, {'tiny random model' if args.tiny else 'default model'}, "
        f"hf float32, {torch.get_num_threads()} threads (generation alone: {generation_s:.1f} s)"
    )
    for column in (
        "L (s)",
        "latency",
        "loop",
        "env_workers",
        "wall (s)",
        "wall - generation (s)",
        "batches",
        "serial bound (s)",
        "one chain (s)",
        "same tokens",
    ):
        table.add_column(column, justify="right")
    cases = [(latency, jitter) for latency in args.latency for jitter in ((False, True) if latency else (False,))]
    for latency, jitter in cases:
        for name in loops:
            rollout = rollout_with(name)
            wall, tokens = timed_rollout(rollout, latency, args.turns, args.episodes, jitter)
            calls = args.turns + 1
            kind = "uniform(0, 2L)" if jitter else "fixed"
            table.add_row(
                f"{latency:g}",
                kind,
                name,
                str(loops[name][1]),
                f"{wall:.1f}",
                f"{wall - generation_s:.1f}",
                str(len(rollout.batches)),
                f"{args.episodes * calls * latency:.1f}",
                f"{calls * latency:.1f}",
                "yes" if tokens == reference else "NO",
            )
            console.print(f"L={latency:g} {kind} {name}: {wall:.1f} s, {len(rollout.batches)} batches")
    console.print(table)


if __name__ == "__main__":
    main()
