"""The default job's rollout and update in fp32 and in bf16, side by side in one process.

    python bench/precision_speed.py [--steps 2] [--repeats 2] [--model smollm2-135m] [--set key=value ...]

Whether bf16 pays depends on the CPU (``precision: auto`` decides from its flags: README, "Which
CPU"); this measures it. Builds the default run (``agentrl train --env math --algo grpo``'s config,
no evaluation) twice, with ``precision=fp32`` and ``precision=bf16`` (the hf engine's ``dtype: auto``
follows each), and for each of ``--steps`` rollout batches times, alternating between the two
(a noisy machine then slows both alike): the rollout (sampling, tokens per second) and the update
of the same batch (the one the fp32 run sampled; forward, backward, clip, AdamW on gradient
recorders, so the weights never change). Prints the medians and bf16's speed-ups (sampled tokens
per second: the two precisions sample different completions; update seconds), and what ``auto``
picks on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from rich.console import Console
from rich.table import Table

from agentrl.config.train import build_config
from agentrl.model.precision import resolve_precision
from agentrl.plugins import load_plugins
from agentrl.testing import GradientRecorder
from agentrl.training.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="rollout batches to time (default 2)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rollouts and updates per precision and batch")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="config override key=value")
    args = parser.parse_args()
    console = Console(width=120)
    auto = resolve_precision("auto")
    console.print(f"precision auto on this machine: {auto.name} ({auto.reason})")
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for name in ("fp32", "bf16"):
            config = build_config(
                overrides={
                    "model": args.model,
                    "eval_tasks": 0,
                    "output_dir": f"{tmp}/{name}",
                    "save_model": False,
                    "checkpoint_every": 0,
                    "log_completions_every": 0,
                    "precision": name,
                },
                sets=args.sets,
            )
            trainers[name] = Trainer(config, load_plugins())
            console.print(f"{name}: {trainers[name].run.engine.description}")
        table = Table("batch", "precision", "sampled tokens", "rollout s", "tokens/s", "update s", "bf16 speed-up")
        for step in range(1, args.steps + 1):
            rollout: dict[str, list[tuple[float, int]]] = {name: [] for name in trainers}
            update: dict[str, list[float]] = {name: [] for name in trainers}
            batch = None
            for _ in range(args.repeats):
                for name, trainer in trainers.items():
                    start = time.perf_counter()
                    sampled, _, _ = trainer.rollout_step(step)
                    rollout[name].append((time.perf_counter() - start, int(sampled.loss_mask.sum())))
                    batch = sampled if name == "fp32" else batch
            for _ in range(args.repeats):
                for name, trainer in trainers.items():
                    trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
                    start = time.perf_counter()
                    trainer.update(batch, {}, step)
                    update[name].append(time.perf_counter() - start)
            medians = {
                name: (
                    statistics.median(s for s, _ in rollout[name]),
                    statistics.median(n for _, n in rollout[name]),
                    statistics.median(update[name]),
                )
                for name in trainers
            }
            for name, (seconds, tokens, update_s) in medians.items():
                fp32_rate = medians["fp32"][1] / medians["fp32"][0]
                ratio = (
                    ""
                    if name == "fp32"
                    else (f"tokens/s {tokens / seconds / fp32_rate:.2f}x, update {medians['fp32'][2] / update_s:.2f}x")
                )
                table.add_row(
                    str(step), name, str(tokens), f"{seconds:.1f}", f"{tokens / seconds:.0f}", f"{update_s:.1f}", ratio
                )
        console.print(table)


if __name__ == "__main__":
    main()
