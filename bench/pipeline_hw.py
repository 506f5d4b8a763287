"""Hardware and model figures for ``bench/pipeline_sim.py``: assumed GPU throughputs, public model shapes,
and a calibration from a run directory measured on this machine.

The GPU figures are assumptions, not measurements (this machine has no GPU): peak numbers are the
vendors' datasheet values (NVIDIA H100 SXM / H200 SXM: 989 dense bf16 TFLOPS, 3.35 / 4.8 TB/s HBM,
80 / 141 GB), scaled by the efficiencies below, which are round figures of the kind inference and
training frameworks report (decode reads about 60% of peak bandwidth, training reaches about 35-40%
MFU). docs/scaling.md lists them; change them with the simulator's flags.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Model:
    """A model shape: parameters and what one token of KV cache costs (bf16)."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int

    @property
    def weight_bytes(self) -> float:
        """bf16 weights."""
        return 2 * self.params

    @property
    def kv_bytes(self) -> float:
        """bf16 K and V of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class GPU:
    """Assumed figures of one accelerator (datasheet peaks; efficiencies are assumptions)."""

    bf16_flops: float
    hbm_bytes_s: float
    memory: float
    decode_bw_eff: float = 0.6
    decode_flops_eff: float = 0.5
    prefill_mfu: float = 0.5
    train_mfu: float = 0.35
    iteration_overhead_s: float = 0.004
    nvlink_bytes_s: float = 360e9
    nic_bytes_s: float = 45e9


MODELS = {  # shapes from the public config.json of each family
    "135m": Model(134.5e6, 30, 3, 64, 576),  # SmolLM2-135M (agentrl's default)
    "1.5b": Model(1.54e9, 28, 2, 128, 1536),  # Qwen2.5-1.5B
    "7b": Model(7.62e9, 28, 4, 128, 3584),  # Qwen2.5-7B
    "70b": Model(70.6e9, 80, 8, 128, 8192),  # Llama-3.1-70B
}
GPUS = {"h100": GPU(989e12, 3.35e12, 80e9), "h200": GPU(989e12, 4.8e12, 141e9)}


def hardware(model: str, gpu: str, context: float, trainers: int, sequence: float | None = None) -> dict:
    """SimConfig fields for ``model`` served and trained on ``gpu``: ``context`` is what the KV cache
    holds per sequence, on average, while it decodes; ``sequence`` the length of a trained episode
    (default ``2 * context``). Training costs 6 FLOPs per parameter and token plus causal attention,
    6 x layers x hidden x sequence length per token (forward and backward)."""
    sequence = 2 * context if sequence is None else sequence
    m, g = MODELS[model], GPUS[gpu]
    tp = 1
    while m.weight_bytes > 0.5 * g.memory * tp:  # weights take at most half of a replica's memory
        tp *= 2
    kv_room = 0.9 * g.memory * tp - m.weight_bytes
    batch = int(max(1, min(512, kv_room // (m.kv_bytes * context))))
    bandwidth = tp * g.hbm_bytes_s * g.decode_bw_eff
    bus = g.nvlink_bytes_s if trainers <= 8 else g.nic_bytes_s
    return {
        "engine_gpus": tp,
        "engine_batch": batch,
        "decode_t0": g.iteration_overhead_s + m.weight_bytes / bandwidth,
        "decode_t1": m.kv_bytes * context / bandwidth + 2 * m.params / (tp * g.bf16_flops * g.decode_flops_eff),
        "prefill_tps": tp * g.bf16_flops * g.prefill_mfu / (2 * m.params),
        "train_tps": g.bf16_flops * g.train_mfu / (6 * m.params + 6 * m.layers * m.hidden * sequence),
        "allreduce_s": 2 * (trainers - 1) / trainers * m.weight_bytes / bus,
        "weight_bytes": m.weight_bytes,
    }


def read_steps(run_dir: Path) -> list[dict]:
    """The step rows of ``run_dir/metrics.jsonl`` that have the rollout and update times."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"--calibrate {run_dir}: no metrics.jsonl there (give an agentrl run directory)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "perf/rollout_seconds" in r and "rollout/sampled_tokens_max" in r]
    if len(rows) < 2:
        raise ValueError(f"--calibrate {run_dir}: needs at least 2 steps with perf/* metrics, found {len(rows)}")
    return rows


def calibration_from_run(run_dir: Path, episodes: int) -> tuple[dict, list[dict]]:
    """SimConfig fields fitted to a single-turn, synchronous run on one host, and its steps.

    Step 1 is left out (allocations and first calls make it slower). The ``hf`` engine decodes a
    static batch (rows that finished still cost a decode slot), so a replica's iteration time does
    not depend on how many sequences are still running: ``decode_t0`` is the median of
    rollout seconds / longest completion, ``decode_t1`` = 0; the trainer's throughput is the median
    of tokens (``episodes`` x mean sequence length) / update seconds.
    """
    steps = read_steps(run_dir)[1:]
    iteration = statistics.median(r["perf/rollout_seconds"] / r["rollout/sampled_tokens_max"] for r in steps)
    tps = statistics.median(episodes * r["rollout/sequence_length_mean"] / r["perf/update_seconds"] for r in steps)
    sampled = statistics.mean(r["rollout/sampled_tokens_mean"] for r in steps)
    prompt = statistics.mean(r["rollout/sequence_length_mean"] - r["rollout/sampled_tokens_mean"] for r in steps)
    cap = max(r["rollout/sampled_tokens_max"] for r in steps)
    fitted = {
        "decode_t0": iteration,
        "decode_t1": 0.0,
        "engine_batch": episodes,
        "train_tps": tps,
        "gen_tokens": sampled,
        "prompt_tokens": prompt,
        "max_gen_tokens": cap,
    }
    return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in fitted.items()}, steps
