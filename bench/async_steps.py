"""Training steps per hour with a slow env: synchronous against ``async_steps`` 1 and 2, side by side.

    python bench/async_steps.py [--latency 0.2 1.0] [--async-steps 0 1 2] [--steps 6] [--turns 4]
                                [--partial] [--model smollm2-135m] [--tiny]

Each configuration trains the model (GRPO, the default batch of 4 prompts x 8 episodes, no
evaluation, no checkpoints) for ``--steps`` steps on ``bench/env_latency.py``'s SlowChat env: every
``reset`` and ``step`` sleeps L seconds (a sandbox, a web call), ``--turns`` model turns an episode
(24 new tokens a turn), rewarded by ``agentrl.testing:parity_reward`` so that groups have a spread
and every step trains. The runs go one after another in one process, on the same machine.

Per configuration it prints steps per hour over the steps after the first two (an asynchronous run
fills its pipeline in them), the learner's mean wait for a batch (``perf/rollout_seconds``: the
whole rollout when synchronous, only what the background collection did not hide otherwise), the
update's mean seconds, the mean staleness of the trained tokens, and the speed-up over the
synchronous run at the same L (figures: README, "Asynchronous training"). ``--partial``: each
``async_steps`` > 0 also with ``partial_rollouts`` (turns in flight take each new version: lower
staleness). ``--tiny``: a random 2-layer model, 3 steps of 2 prompts x 2 episodes of 8-token turns, L = 0 and
0.05, async 0 and 1, and 1 with partial rollouts (proves the script runs; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentrl.config.train import TrainConfig
from agentrl.model.loading import DEFAULT_MODEL, load_tokenizer
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model
from agentrl.training.trainer import Trainer

SLOW_CHAT = f"{Path(__file__).resolve().parent / 'env_latency.py'}:SlowChat"


class StepClock:
    """A progress callback that keeps each step's end time and metrics."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.rows: list[dict[str, float]] = []

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        self.ends.append(time.perf_counter())
        self.rows.append(dict(metrics))

    def steps_per_hour(self, skip: int) -> float:
        """Steps per hour between the end of step ``skip`` and the last step's end."""
        done = len(self.ends) - skip
        return 3600.0 * done / (self.ends[-1] - self.ends[skip - 1])

    def mean(self, key: str, skip: int) -> float:
        values = [row[key] for row in self.rows[skip:] if key in row]
        return statistics.fmean(values) if values else 0.0


def train(
    model: str,
    latency: float,
    async_steps: int,
    steps: int,
    turns: int,
    out: Path,
    extra: dict[str, Any],
    partial: bool = False,
) -> StepClock:
    """One timed training run; returns its clock."""
    config = TrainConfig(
        model=model,
        env=SLOW_CHAT,
        env_args={"latency": latency, "turns": turns},
        max_steps=steps,
        rewards={"agentrl.testing:parity_reward": 1.0},
        eval_tasks=0,
        checkpoint_every=0,
        save_model=False,
        log_completions_every=0,
        async_steps=async_steps,
        partial_rollouts=partial,
        output_dir=str(out / f"L{latency}-async{async_steps}{partial}"),
        **{"max_new_tokens": 24, **extra},
    )
    clock = StepClock()
    Trainer(config, load_plugins()).train(progress=clock)
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, nargs="+", default=[0.2, 1.0])
    parser.add_argument("--async-steps", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--partial", action="store_true", help="each async_steps > 0 with partial_rollouts too")
    parser.add_argument("--model", default="smollm2-135m", help="any --model value (a local folder too)")
    parser.add_argument("--tiny", action="store_true", help="a random tiny model, 3 steps, L = 0 0.05, async 0 1")
    args = parser.parse_args()
    extra: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="agentrl-async-bench-"))
    if args.tiny:
        args.latency, args.async_steps, args.steps, args.turns, args.partial = [0.0, 0.05], [0, 1], 3, 2, True
        tokenizer = load_tokenizer(DEFAULT_MODEL)
        build_tiny_model(len(tokenizer)).save_pretrained(work / "tiny")
        tokenizer.save_pretrained(work / "tiny")
        args.model = str(work / "tiny")
        extra = {"prompts_per_step": 2, "num_generations": 2, "max_new_tokens": 8}
    skip = 2 if args.steps > 3 else 1
    table = Table(title=f"{args.model}, {args.turns} turns an episode, steps {skip + 1}-{args.steps} timed")
    for column in (
        "L (s)",
        "async_steps",
        "partial",
        "steps / hour",
        "wait for batch (s)",
        "update (s)",
        "staleness",
        "vs sync",
    ):
        table.add_column(column, justify="right")
    for latency in args.latency:
        baseline = None
        runs = [(n, p) for n in args.async_steps for p in ((False, True) if n and args.partial else (False,))]
        if args.tiny:
            runs = runs if latency else [(n, p) for n, p in runs if not p]  # one partial run: L = 0.05
        for async_steps, partial in runs:
            clock = train(args.model, latency, async_steps, args.steps, args.turns, work, extra, partial)
            rate = clock.steps_per_hour(skip)
            baseline = rate if async_steps == 0 else baseline
            line = (
                f"L={latency:g} async_steps={async_steps}{'+partial' if partial else ''}: {rate:.1f} steps/hour, "
                f"wait {clock.mean('perf/rollout_seconds', skip):.1f} s, "
                f"update {clock.mean('perf/update_seconds', skip):.1f} s, "
                f"staleness {clock.mean('async/staleness_mean', skip):.2f}"
            )
            print(line, flush=True)
            table.add_row(
                f"{latency:g}",
                str(async_steps),
                "yes" if partial else "",
                f"{rate:.1f}",
                f"{clock.mean('perf/rollout_seconds', skip):.1f}",
                f"{clock.mean('perf/update_seconds', skip):.1f}",
                f"{clock.mean('async/staleness_mean', skip):.2f}",
                f"{rate / baseline:.2f}x" if baseline else "-",
            )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
