"""The update of the main job's step with and without a backward for groups whose rewards are equal.

    OMP_NUM_THREADS=2 python bench/inert_groups.py [--precision auto] [--rounds 3] [--seed 0]

Collects one rollout batch of the main job (``agentrl train --env math --algo grpo`` on the default
model, its default config), then times ``Learner.update`` on it from the same weights and optimizer
state, the two variants alternating: ``every backward`` (every micro-batch backpropagated, as before
``GroupRelative.inert_rows``) and ``no backward for equal groups`` (the default: a micro-batch of
groups whose rewards are all equal, advantage 0, runs its forward without grad and no backward).
Prints the share of such groups, each variant's best seconds, and whether the two trained the same
weights bit for bit.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time

import torch
from prefix_cache import cpu_name  # the bench folder is not a package

from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.training.build import build_run
from agentrl.training.learner import Learner
from agentrl.training.rollout_phase import RolloutPhase


def main() -> None:
    """Collect one batch, time both variants' updates on it, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(precision=options.precision, seed=options.seed, eval_tasks=0, output_dir=tmp)
        run = build_run(config, load_plugins())
        taken = RolloutPhase(run).collect(1)
        start = {
            "weights": copy.deepcopy(run.model.state_dict()),
            "optimizer": copy.deepcopy(run.trained["policy"].optimizer.state_dict()),
        }
        inert_rows = run.algorithm.inert_rows
        variants = {"every backward": lambda batch: None, "no backward for equal groups": inert_rows}
        best: dict[str, float] = {}
        trained: dict[str, dict[str, torch.Tensor]] = {}
        metrics: dict[str, float] = {}
        for _ in range(options.rounds):
            for name, rows in variants.items():
                run.model.load_state_dict(start["weights"])
                run.trained["policy"].optimizer.load_state_dict(start["optimizer"])
                run.algorithm.inert_rows = rows
                batch, metrics = copy.deepcopy(taken.batch), dict(taken.metrics)
                began = time.perf_counter()
                Learner(run).update(batch, metrics, step=1)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - began)
                trained[name] = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
    same = all(torch.equal(trained["every backward"][k], v) for k, v in trained["no backward for equal groups"].items())
    share = metrics["advantage/frac_zero_std_groups"]
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, precision {run.precision.name}")
    print(f"one batch of {taken.batch.num_rows} episodes, {share:.0%} of its groups with equal rewards")
    for name, seconds in best.items():
        print(f"{name:<30} update {seconds:6.2f} s (best of {options.rounds})")
    print(
        f"ratio {best['no backward for equal groups'] / best['every backward']:.3f}; same weights bit for bit: {same}"
    )


if __name__ == "__main__":
    main()
