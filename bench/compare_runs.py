"""Compare finished runs side by side: held-out accuracy before/during/after, wall time, memory.

    python bench/compare_runs.py runs/math-grpo runs/math-ppo [--plot compare.png] [--key env/solved]

Prints one row per run dir (from its ``metrics.jsonl`` and ``eval.json``): greedy and sampled
held-out accuracy at every evaluation, training minutes (the sum of ``perf/step_seconds``, and the
median step), peak
resident memory (``perf/peak_rss_gb``), and the mean of any ``--key`` metric over each third of
training. ``--plot`` writes a PNG of greedy held-out accuracy against step for every run.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def load(run_dir: Path) -> tuple[list[dict], dict]:
    """The run's metric lines (one per step, final line included) and its eval.json."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = json.loads((run_dir / "eval.json").read_text())
    return lines, evals


def accuracy_curve(lines: list[dict], evals: dict, key: str) -> list[tuple[int, float]]:
    """(step, value) of ``eval/<key>`` at step 0, every eval_every step, and the end."""
    curve = [(0, evals["before"].get(key, math.nan))]
    curve += [(line["step"], line[key]) for line in lines if key in line]
    last = max((line["step"] for line in lines), default=0)
    curve.append((last, evals["after"].get(key, math.nan)))
    return curve


def thirds(lines: list[dict], key: str) -> list[float]:
    """Mean of ``key`` over the first, second and last third of the training steps."""
    steps = [line for line in lines if line.get(key) is not None]  # null: not finite that step
    n = len(steps)
    parts = [steps[: n // 3], steps[n // 3 : 2 * n // 3], steps[2 * n // 3 :]]
    return [sum(s[key] for s in part) / len(part) if part else math.nan for part in parts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--key", action="append", default=[], help="training metric to average by thirds")
    parser.add_argument("--eval-key", default="accuracy", help="held-out metric after eval/ (e.g. env/solved)")
    args = parser.parse_args()
    curves = {}
    for run_dir in args.runs:
        lines, evals = load(run_dir)
        greedy = accuracy_curve(lines, evals, f"eval/{args.eval_key}")
        sampled = accuracy_curve(lines, evals, "eval/accuracy_sampled") if args.eval_key == "accuracy" else []
        curves[run_dir.name] = greedy
        step_seconds = sorted(line["perf/step_seconds"] for line in lines if "perf/step_seconds" in line)
        seconds, median = sum(step_seconds), step_seconds[len(step_seconds) // 2] if step_seconds else math.nan
        peak = max((line.get("perf/peak_rss_gb", math.nan) for line in lines), default=math.nan)
        print(f"{run_dir.name}: train {seconds / 60:.1f} min (median {median:.1f} s/step), peak RSS {peak:.1f} GB")
        print("  greedy  " + " -> ".join(f"{v:.3f}" for _, v in greedy) + f"  (steps {[s for s, _ in greedy]})")
        print("  sampled " + " -> ".join(f"{v:.3f}" for _, v in sampled))
        for key in args.key:
            print(f"  {key} by thirds: " + " / ".join(f"{v:.3f}" for v in thirds(lines, key)))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, curve in curves.items():
            ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", label=name)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
