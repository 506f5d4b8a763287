"""The tables of docs/scaling.md, from ``bench/pipeline_sim.py`` (simulated time; a few minutes of CPU).

    python bench/scaling_tables.py              # every table
    python bench/scaling_tables.py --table sync # one: ratio, sync, staleness, scale, breaks

Every scenario is a 7B model on H100-class GPUs (bench/pipeline_hw.py's assumed figures) unless a
table says otherwise: episodes of 4 turns, a 500-token prompt, 200-token env replies, lognormal
turn lengths (sigma 0.5, capped at 4x the mean) and env latencies (sigma 0.5), weights broadcast at
100 Gb/s, 8 simulated steps of which the last 5 are measured.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_hw import MODELS, hardware  # noqa: E402
from pipeline_sim import SimConfig, SimResult, episode_tokens, mean_context, simulate  # noqa: E402

SCENARIO = dict(
    turns=4, prompt_tokens=500, obs_tokens=200, gen_sigma=0.5, env_sigma=0.5, sync_gbps=100, steps=8, warmup=3
)
TARGET = 0.9


def config(model: str = "7b", gpu: str = "h100", generated: float = 8192, **values) -> tuple[SimConfig, int]:
    """A scenario's SimConfig (``generated``: sampled tokens per episode) and the GPUs of one replica."""
    values = {**SCENARIO, **values}
    values.update(gen_tokens=generated / values["turns"], max_gen_tokens=4 * generated / values["turns"])
    hw = hardware(model, gpu, mean_context(values), values.get("trainers", 1), episode_tokens(values))
    tp = hw.pop("engine_gpus")
    return SimConfig(**{**hw, **values}), tp


def with_(cfg: SimConfig, **values) -> SimConfig:
    return SimConfig(**{**asdict(cfg), **values})


def smallest_engines(cfg: SimConfig, cap: int) -> tuple[int, SimResult] | None:
    """Fewest replicas (doubling, then bisection) whose trainer utilisation reaches TARGET, or None up to ``cap``."""
    high, result = 1, simulate(with_(cfg, engines=1))
    while result.trainer_util < TARGET:
        if high >= cap:
            return None
        high = min(cap, high * 2)
        result = simulate(with_(cfg, engines=high))
    low = high // 2
    best = (high, result)
    while high - low > max(1, high // 8):
        mid = (low + high) // 2
        r = simulate(with_(cfg, engines=mid))
        if r.trainer_util >= TARGET:
            high, best = mid, (mid, r)
        else:
            low = mid
    return best


def ratio_table() -> None:
    """Replicas per trainer GPU that keep 8 trainer GPUs >= 90% busy, and the smallest k that allows it."""
    print(
        "| sampled tokens / episode | env latency / turn | replicas per trainer GPU | smallest k | staleness | s/step |"
    )
    print("|---|---|---|---|---|---|")
    for generated in (1024, 8192, 32768):
        for latency in (0.1, 1.0, 10.0):
            base, _ = config(generated=generated, env_latency=latency, trainers=8, episodes=512, partial=True)
            for k in (1, 2, 4, 8):
                found = smallest_engines(with_(base, async_steps=k, inflight_batches=k), cap=256)
                if found:
                    engines, r = found
                    print(
                        f"| {generated} | {latency:g} s | {engines / 8:.2f} ({engines} replicas) | {k} | "
                        f"{r.staleness_mean:.2f} | {r.step_s:.0f} |"
                    )
                    break
            else:
                print(f"| {generated} | {latency:g} s | > 32 | > 8 | | |")


def sync_table() -> None:
    """Seconds to move bf16 weights to E replicas: broadcast against one copy per replica."""
    print("| model (bf16 bytes) | link | broadcast | per replica, 8 | per replica, 64 | per replica, 512 |")
    print("|---|---|---|---|---|---|")
    for name in ("1.5b", "7b", "70b"):
        size = MODELS[name].weight_bytes
        for gbps in (10, 100, 400):
            cells = [
                SimConfig(weight_bytes=size, sync_gbps=gbps, engines=e, sync_mode="per-replica").sync_s()
                for e in (8, 64, 512)
            ]
            one = SimConfig(weight_bytes=size, sync_gbps=gbps, engines=512).sync_s()
            print(
                f"| {name} ({size / 1e9:.1f} GB) | {gbps} Gb/s | {one:.2f} | "
                + " | ".join(f"{c:,.1f}" for c in cells)
                + " |"
            )


def staleness_table() -> None:
    """Sweep k on one scenario: one batch at a time (agentrl today) against partial rollouts, k batches in flight."""
    base, _ = config(generated=8192, env_latency=1.0, trainers=8, episodes=512, engines=18, steps=12, warmup=5)
    print(
        "| k | one batch at a time: steps/h, trainer, staleness | partial, k batches in flight: steps/h, trainer, staleness |"
    )
    print("|---|---|---|")
    for k in range(0, 5):
        one = simulate(with_(base, async_steps=k))
        part = simulate(with_(base, async_steps=k, partial=True, inflight_batches=max(1, k)))
        print(
            f"| {k} | {one.steps_per_hour:.1f}, {one.trainer_util:.2f}, {one.staleness_mean:.2f} | "
            f"{part.steps_per_hour:.1f}, {part.trainer_util:.2f}, {part.staleness_mean:.2f} |"
        )


def designs(gpus: int) -> SimConfig:
    """A design for ``gpus`` GPUs: 7B, 8k tokens, 1 s env latency, 30% of the GPUs train, 16 episodes per GPU, k = 4."""
    trainers = max(1, round(gpus * 0.3))
    cfg, _ = config(
        generated=8192,
        env_latency=1.0,
        trainers=trainers,
        engines=gpus - trainers,
        episodes=16 * gpus,
        partial=True,
        async_steps=4,
        inflight_batches=4,
        steps=9,
        warmup=5,
    )
    return cfg


def row(label: str, cfg: SimConfig, r: SimResult) -> str:
    return (
        f"| {label} | {cfg.trainers} + {cfg.engines} | {cfg.episodes} | {r.steps_per_hour:.1f} | {r.trainer_util:.2f} | "
        f"{r.engine_util:.2f} | {r.staleness_mean:.2f} | {r.sync_s:.1f} |"
    )


HEADER = "| design | trainer + engine GPUs | episodes / step | steps/h | trainer busy | engine (of peak tokens/s) | staleness | sync s |\n|---|---|---|---|---|---|---|---|"


def scale_table() -> None:
    """The same design at 8, 64 and 1,000 GPUs."""
    print(HEADER)
    for gpus in (8, 64, 1000):
        cfg = designs(gpus)
        print(row(f"{gpus} GPUs", cfg, simulate(cfg)))


def breaks_table() -> None:
    """At 1,000 GPUs, one change at a time from the design above."""
    base = designs(1000)
    episodes = base.episodes
    print(HEADER)
    for label, change in (
        ("the design (broadcast, no driver cost, one env worker per episode)", {}),
        ("weights sent to each replica in turn", dict(sync_mode="per-replica")),
        ("one driver handles each turn and env call, 1 ms each", dict(driver_ms=1.0)),
        ("one driver, 0.1 ms each", dict(driver_ms=0.1)),
        (f"{episodes // 8} env workers (1 per 8 episodes)", dict(env_workers=episodes // 8)),
        ("long tail: turn lengths sigma 1.0 (capped at 4x)", dict(gen_sigma=1.0)),
        ("long tail, one batch at a time (not partial)", dict(gen_sigma=1.0, partial=False, inflight_batches=1)),
    ):
        cfg = with_(base, **change)
        print(row(label, cfg, simulate(cfg)))


TABLES = {
    "ratio": ratio_table,
    "sync": sync_table,
    "staleness": staleness_table,
    "scale": scale_table,
    "breaks": breaks_table,
}


def main(argv: list[str] | None = None) -> int:
    """Print the chosen tables as Markdown."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", choices=sorted(TABLES), action="append", help="one table (repeatable); default: all")
    for name in p.parse_args(argv).table or list(TABLES):
        print(f"\n{name}: {TABLES[name].__doc__.splitlines()[0]}\n")
        TABLES[name]()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
