"""The default job's steps with glibc's large blocks kept in the heap (the default) and mapped anew.

    OMP_NUM_THREADS=2 python bench/large_blocks.py [--steps 4] [--rounds 2] [--precision fp32] [--set KEY=JSON ...]

Runs the main job (``agentrl train --env math --algo grpo``, default config, ``--steps`` steps) in
a fresh process per arm, the arms alternated ``--rounds`` times: ``kept`` as the trainer sets up a
CPU run (:func:`agentrl.training.memory.keep_large_blocks`), ``mapped`` with glibc's defaults
(``AGENTRL_KEEP_LARGE_BLOCKS=0``): every block above its mmap threshold (which grows with the
blocks freed, up to 32 MiB) mapped on its own and faulted in page by page. Printed per run: each step's rollout and
update seconds, the seconds of the steps after the first (warm-up) and the peak RSS; then each
arm's median of those sums and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from prefix_cache import cpu_name  # the bench folder is not a package

ARMS = {"kept": {}, "mapped": {"AGENTRL_KEEP_LARGE_BLOCKS": "0"}}


def one_run(steps: int, options: dict) -> dict:
    """This process: the main job for ``steps`` steps; its per-step seconds and peak RSS."""
    import agentrl

    with tempfile.TemporaryDirectory() as tmp:
        config = dict(env="math", algo="grpo", max_steps=steps, eval_tasks=0, save_model=False, verbose=False)
        config.update(output_dir=str(Path(tmp) / "run"), **options)
        with agentrl.Trainer(**config) as trainer:
            metrics = [trainer.train_step() for _ in range(steps)]
    split = [(m["perf/rollout_seconds"], m["perf/update_seconds"]) for m in metrics]
    return {"steps": split, "after_first": sum(a + b for a, b in split[1:]), "peak_gb": metrics[-1]["perf/peak_rss_gb"]}


def main() -> None:
    """Alternate the arms in fresh processes, print each run and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    options = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)}
    options["precision"] = args.precision
    if args.child:
        print(json.dumps(one_run(args.steps, options)))
        return
    print(f"{cpu_name()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, options {options}")
    sums: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(args.rounds):
        for arm, env in ARMS.items():
            command = [
                sys.executable,
                __file__,
                "--child",
                arm,
                "--steps",
                str(args.steps),
                "--precision",
                args.precision,
            ]
            command += [item for pair in (("--set", s) for s in args.set) for item in pair]
            out = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            sums[arm].append(result["after_first"])
            steps = ", ".join(f"{r:.1f}+{u:.1f}" for r, u in result["steps"])
            print(f"{arm:7s} steps (rollout+update s) {steps}; after the first {result['after_first']:.1f} s; "
                  f"peak RSS {result['peak_gb']:.2f} GB")  # fmt: skip
    kept, mapped = (statistics.median(sums[arm]) for arm in ARMS)
    print(f"median seconds of steps 2..{args.steps}: kept {kept:.1f}, mapped {mapped:.1f}, ratio {kept / mapped:.3f}")


if __name__ == "__main__":
    main()
