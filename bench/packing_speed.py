"""Training-update time with and without prefix-tree packing, side by side in one process.

    python bench/packing_speed.py [--steps 2] [--repeats 2] [--model smollm2-135m] [--set key=value ...]

Builds the default run (``agentrl train --env math --algo grpo``'s config, no evaluation), rolls
out ``--steps`` batches and times the update of each batch ``--repeats`` times with
``pack_sequences`` on and off, alternating (a noisy machine then slows both alike). The update
is the whole optimizer step (forward, backward, clip, AdamW), on fresh gradient recorders so the
weights never change between the timed variants. Prints a table: per batch, the padded and
packed tokens the forward computes, the median seconds of each variant and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

from rich.console import Console
from rich.table import Table

from agentrl.config.train import build_config
from agentrl.model.packing import pack_prefix_tree
from agentrl.plugins import load_plugins
from agentrl.testing import GradientRecorder
from agentrl.training.batching import plan_micro_batches
from agentrl.training.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="rollout batches to time (default 2)")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per variant and batch (default 2)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="config override key=value")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        config = build_config(
            overrides={
                "model": args.model,
                "eval_tasks": 0,
                "output_dir": f"{tmp}/run",
                "save_model": False,
                "checkpoint_every": 0,
                "log_completions_every": 0,
            },
            sets=args.sets,
        )
        trainer = Trainer(config, load_plugins())
        console.print(
            f"precision {trainer.run.precision.name} ({trainer.run.precision.reason}); packing checked: "
            f"{trainer.run.policy_pack}"
        )
        table = Table(
            "batch", "rows", "real tokens", "padded tokens", "packed tokens", "padded s", "packed s", "speed-up"
        )
        policy = trainer.accelerator.unwrap_model(trainer.run.policy)
        for step in range(1, args.steps + 1):
            batch, _, _ = trainer.rollout_step(step)
            seconds: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for pack in (False, True):
                    trainer.config = dataclasses.replace(config, pack_sequences=pack)
                    policy.pack = trainer.run.policy_pack = pack
                    trainer.run.trained["policy"].optimizer = GradientRecorder(trainer.model.parameters())
                    start = time.perf_counter()
                    trainer.update(batch, {}, step)
                    seconds[pack].append(time.perf_counter() - start)
            plans = trainer.learner.micro_batch_rows(batch)  # the packed plan (pack_sequences is on last)
            packed = sum(
                pack_prefix_tree(batch.select(rows).input_ids, batch.select(rows).attention_mask).length
                for rows in plans
            )
            padded_plan = plan_micro_batches(batch.lengths.tolist(), config.micro_batch_size, config.micro_batch_tokens)
            padded = sum(len(rows) * int(batch.lengths[rows].max()) for rows in padded_plan)
            padded_s, packed_s = statistics.median(seconds[False]), statistics.median(seconds[True])
            table.add_row(
                str(step),
                str(batch.num_rows),
                str(int(batch.lengths.sum())),
                str(padded),
                str(packed),
                f"{padded_s:.1f}",
                f"{packed_s:.1f}",
                f"{padded_s / packed_s:.2f}x",
            )
        console.print(table)


if __name__ == "__main__":
    main()
