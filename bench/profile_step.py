"""Where the default step's time goes: a ``torch.profiler`` table of one step of the main job.

    python bench/profile_step.py [--warmup 1] [--rows 25] [--sort self_cpu_time_total] [--set KEY=JSON ...]

Builds the main job (``agentrl train --env math --algo grpo`` on the default model, its default
config; ``--set`` changes a key), runs ``--warmup`` steps, then profiles one more step and prints
the step's rollout / update seconds and the ``--rows`` operators that took the most time (self CPU
time by default), so a change to the engine or the update shows up as a change in this table. The
profiler's own overhead (a few percent) is in every row; compare two tables from one machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import agentrl


def main() -> None:
    """Warm up, profile one step, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--sort", default="self_cpu_time_total")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    options = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)}
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line), "?")
    with tempfile.TemporaryDirectory() as tmp:
        config = dict(env="math", algo="grpo", max_steps=args.warmup + 1, eval_tasks=0, save_model=False)
        config.update(output_dir=str(Path(tmp) / "run"), verbose=False, **options)
        with agentrl.Trainer(**config) as trainer:
            for _ in range(args.warmup):
                trainer.train_step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                metrics = trainer.train_step()
    print(f"{cpu_name}, {torch.get_num_threads()} threads, options {options or 'default'}")
    print(
        f"step {metrics['perf/step_seconds']:.1f} s: rollout {metrics['perf/rollout_seconds']:.1f} s, "
        f"update {metrics['perf/update_seconds']:.1f} s; {metrics['rollout/sampled_tokens_mean']:.0f} sampled tokens "
        "an episode"
    )
    print(prof.key_averages().table(sort_by=args.sort, row_limit=args.rows, max_name_column_width=40))


if __name__ == "__main__":
    main()
