"""Where the default step's time goes: a ``torch.profiler`` table of one step of the main job.

    python bench/profile_step.py [--warmup 0] [--rows 25] [--sort self_cpu_time_total] [--set KEY=JSON ...]

Builds the main job (``agentrl train --env math --algo grpo`` on the default model, its default
config; ``--set`` changes a key), runs ``--warmup`` steps, then profiles one more step and prints
the step's rollout / update seconds and the ``--rows`` operators that took the most time (self CPU
time by default), so a change to the engine or the update shows up as a change in this table. The
profiler's own overhead (a few percent) is in every row; compare two tables from one machine.
The engine samples in the trainer's thread (``agentrl.sample_here``), so the step's table holds the
rollout's sampling and the update; a second table profiles the engine alone sampling the step's
prompts again (``--engine-rows``; same sampling parameters, seed and engine as the step).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from prefix_cache import cpu_name  # the bench folder is not a package
from torch.profiler import ProfilerActivity, profile

import agentrl


def main() -> None:
    """Warm up, profile one step, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--engine-rows", type=int, default=15)
    parser.add_argument("--sort", default="self_cpu_time_total")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    options = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)}
    with tempfile.TemporaryDirectory() as tmp:
        config = dict(env="math", algo="grpo", max_steps=args.warmup + 1, eval_tasks=0, save_model=False)
        config.update(log_completions_every=1)  # the step's prompts, sampled again by profile_engine
        config.update(output_dir=str(Path(tmp) / "run"), verbose=False, **options)
        with agentrl.Trainer(**config) as trainer:
            for _ in range(args.warmup):
                trainer.train_step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                metrics = trainer.train_step()
            engine_table, engine_seconds = profile_engine(trainer, args)
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, options {options or 'default'}")
    print(
        f"step {metrics['perf/step_seconds']:.1f} s: rollout {metrics['perf/rollout_seconds']:.1f} s, "
        f"update {metrics['perf/update_seconds']:.1f} s; {metrics['rollout/sampled_tokens_mean']:.0f} sampled tokens "
        "an episode"
    )
    print(prof.key_averages().table(sort_by=args.sort, row_limit=args.rows, max_name_column_width=40))
    print(
        f"the engine sampling the step's {metrics['perf/episodes_per_second'] * metrics['perf/step_seconds']:.0f} "
        f"prompts again in this thread: {engine_seconds:.1f} s"
    )
    print(engine_table)


def profile_engine(trainer: agentrl.Trainer, args: argparse.Namespace) -> tuple[str, float]:
    """The engine's operator table and seconds for sampling the last step's prompts once more."""
    run = trainer.run_trainer.run
    episodes = [json.loads(line) for line in (trainer.run_dir / "completions.jsonl").read_text().splitlines()]
    tokenizer = run.tokenizer
    prompts = [
        list(tokenizer.apply_chat_template(e["messages"][:-1], add_generation_prompt=True)["input_ids"])
        for e in episodes
    ]
    sampling = agentrl.SamplingParams(max_new_tokens=run.config.max_new_tokens, temperature=1.0, seed=0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run.engine.generate(prompts, sampling)
        seconds = time.perf_counter() - start
    return prof.key_averages().table(sort_by=args.sort, row_limit=args.engine_rows, max_name_column_width=40), seconds


if __name__ == "__main__":
    main()
