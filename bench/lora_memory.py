"""Full fine-tune vs LoRA on the default job: seconds per step, peak memory, trainable parameters,
checkpoint size.

    python bench/lora_memory.py [--steps 3] [--rank 16] [--model smollm2-135m] [--set key=value ...]

Each variant trains ``agentrl train --env math --algo grpo`` (the default config, ``--steps``
steps, no evaluation, a checkpoint at the last step) in its own subprocess, so its peak resident
memory (``VmHWM``, as ``perf/peak_rss_gb`` logs it after each step) is its own. Prints one row
per variant: median and per-step seconds, the peak RSS after each step, trainable parameters,
and the size of the last checkpoint (weights or adapter, optimizer state, RNG states).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def child(variant: str, rank: int, steps: int, model: str, sets: list[str], out: Path) -> None:
    """Train one variant in this process and write ``result.json`` beside the run."""
    from agentrl.config.train import build_config
    from agentrl.model.lora import trainable_count
    from agentrl.plugins import load_plugins
    from agentrl.training.trainer import Trainer

    lora = [f"lora.r={rank}"] if variant == "lora" else []
    config = build_config(
        overrides={"model": model, "max_steps": steps, "output_dir": str(out / "run")},
        sets=[
            "eval_tasks=0",
            f"checkpoint_every={steps}",
            "log_completions_every=0",
            "save_model=false",
            "keep_finished_checkpoints=true",
            *lora,
            *sets,
        ],
    )
    trainer = Trainer(config, load_plugins())
    trainable = trainable_count(trainer.model)
    trainer.train()
    (out / "result.json").write_text(json.dumps({"trainable": trainable}))


def run_variant(variant: str, args: argparse.Namespace) -> dict:
    """Train ``variant`` in a subprocess; its figures from the run dir."""
    with tempfile.TemporaryDirectory(prefix=f"lora-bench-{variant}-") as tmp:
        out = Path(tmp)
        cmd = [
            sys.executable,
            __file__,
            "--child",
            variant,
            "--out",
            str(out),
            "--rank",
            str(args.rank),
            "--steps",
            str(args.steps),
            "--model",
            args.model,
            *[x for s in args.set for x in ("--set", s)],
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
        lines = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [line for line in lines if "perf/step_seconds" in line]
        checkpoint = max((out / "run" / "checkpoints").glob("step-*"))
        size = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
        return {
            "variant": variant,
            "trainable": json.loads((out / "result.json").read_text())["trainable"],
            "seconds": [s["perf/step_seconds"] for s in steps],
            "rss": [s["perf/peak_rss_gb"] for s in steps],
            "checkpoint_mb": size / 1e6,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per variant")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (lora.r)")
    parser.add_argument("--model", default="smollm2-135m", help="model (folder, run dir or alias)")
    parser.add_argument("--set", action="append", default=[], help="extra key=value for both variants")
    parser.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rank, args.steps, args.model, args.set, args.out)
        return
    rows = [run_variant(variant, args) for variant in ("full", "lora")]
    print(f"{args.steps} steps of the default job on {args.model}; LoRA r={args.rank}")
    print(
        f"{'variant':<8} {'s/step (median)':>16}  {'s per step':<24} {'peak RSS GB after each step':<28} "
        f"{'trainable params':>17} {'checkpoint MB':>14}"
    )
    for row in rows:
        median = sorted(row["seconds"])[len(row["seconds"]) // 2]
        per_step = " ".join(f"{s:.1f}" for s in row["seconds"])
        rss = " ".join(f"{r:.2f}" for r in row["rss"])
        name = row["variant"] if row["variant"] == "full" else f"lora-r{args.rank}"
        print(
            f"{name:<8} {median:>16.1f}  {per_step:<24} {rss:<28} {row['trainable']:>17,} {row['checkpoint_mb']:>14.1f}"
        )


if __name__ == "__main__":
    main()
