"""Resident memory (RSS) of a default training run, step by step, with switches for candidate fixes.

    python bench/memory_growth.py [--steps 20] [--trim] [--mmap-threshold-mb 1] [--arena-max 2]
                                  [--set engine_args.dtype=float32] [--plot rss.png] [--json rss.json]

Runs ``Trainer.train`` in this process on the default config (SmolLM2-135M, math, GRPO, 4 tasks x 8
episodes, 64 new tokens, ``precision: auto``: bf16 autocast where the CPU computes bf16 natively, fp32
elsewhere) for ``--steps`` steps. By default the
evaluations and checkpoints are off (``--eval-tasks``/``--eval-every``/``--checkpoint-every`` turn
them on) so that only the training steps are measured. After every step it records:

* ``rss``: current resident memory; ``peak``: peak resident memory so far;
* glibc ``mallinfo2``: ``heap`` (malloc's heaps), ``free`` (bytes freed but kept in them),
  ``used`` (live heap bytes), ``mmap`` (blocks mapped on their own);
* ``pyobj``: objects the GC tracks (and ``--tracemalloc``: Python-allocated MB), ``thr``: threads;
* the step's time, its update's (forward and backward passes, optimizer) and its mean sequence
  and sampled lengths (tensor shapes change every step).

and prints a table, then the RSS slope in MB/step over the steps after ``--warmup``.

Switches (compare the slope with and without each):

* ``--trim``: ``malloc_trim(0)`` after every step (``agentrl.training.memory.release_free_memory``); the
  table then shows ``rss`` before the trim and ``rss_trim`` after it;
* ``--mmap-threshold-mb N``: fix glibc's mmap threshold at N MB before the model loads (stops the
  dynamic threshold growing to 32 MB, so large tensors are mapped/unmapped one by one);
* ``--arena-max N``: cap glibc's malloc arenas before torch loads (as ``MALLOC_ARENA_MAX``; the env
  var itself, set before python starts, works too and is shown in the header);
* ``--kernel-cache N``: cap oneDNN's primitive cache and ideep's operator cache at N entries
  each (``agentrl.training.memory.limit_kernel_caches``; the env vars ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``
  and ``LRU_CACHE_CAPACITY`` do the same and are shown in the header);
* ``--gc``: ``gc.collect()`` after every step; ``--tracemalloc``: trace Python allocations and print
  the biggest growth between the warm-up and the last step;
* ``--set key=value``: any config override (``engine_args.dtype=float32`` samples with the fp32
  model, no bf16 copy; ``precision=fp32`` turns autocast off; ``call_timeout_s=0`` runs rewards and
  env calls in the main thread instead of a thread per call; ``gradient_checkpointing=true``
  recomputes the decoder blocks in the backward pass; ``env=calculator``: longer, multi-turn episodes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any


def _load_memory_module() -> Any:
    """``agentrl/training/memory.py`` loaded on its own: importing the ``agentrl`` package would load torch
    (and its threads' arenas) before the malloc options below are set."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "agentrl" / "training" / "memory.py"
    spec = importlib.util.spec_from_file_location("agentrl_memory_standalone", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr] - dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


memory = _load_memory_module()
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc mallopt parameters


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the slope fit (default 3)")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after every step")
    parser.add_argument(
        "--mmap-threshold-mb",
        type=float,
        default=None,
        help="fix glibc's mmap threshold at this many MB before the model loads",
    )
    parser.add_argument("--arena-max", type=int, default=None, help="cap glibc's malloc arenas (mallopt)")
    parser.add_argument(
        "--kernel-cache",
        type=int,
        default=None,
        metavar="N",
        help="cap oneDNN's and ideep's kernel caches at N entries (agentrl.training.memory.limit_kernel_caches)",
    )
    parser.add_argument("--gc", action="store_true", help="gc.collect() after every step")
    parser.add_argument("--tracemalloc", action="store_true", help="trace Python allocations (slower)")
    parser.add_argument("--eval-tasks", type=int, default=0, help="held-out tasks per evaluation (default 0: none)")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (default 0: never)")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every N steps (default 0)")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, as agentrl train --set (repeatable)",
    )
    parser.add_argument("--plot", metavar="PNG", help="save a plot of rss/peak/heap per step")
    parser.add_argument("--json", metavar="PATH", help="save the per-step records as JSON")
    parser.add_argument("--output-dir", help="run dir to keep (default: a temporary one, removed)")
    return parser.parse_args(argv)


class Recorder:
    """The trainer's ``progress`` callback: measures memory after each step (and trims)."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.rows: list[dict[str, Any]] = []
        self.snapshot: Any = None
        self.last = time.perf_counter()

    def phase(self, label: str) -> None:
        if label == "rollout" and not self.rows:
            self.last = time.perf_counter()  # the first step's clock starts after the eval before

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        if self.options.gc:
            gc.collect()
        row: dict[str, Any] = {
            "step": step,
            "seconds": now - self.last,
            "update": metrics.get("perf/update_seconds", float("nan")),
            "rss": memory.rss_gb(),
        }
        stats = memory.malloc_stats()
        if stats is not None:
            row.update(heap=stats.heap_gb, free=stats.free_gb, used=stats.in_use_gb, mmap=stats.mmapped_gb)
        if self.options.trim:
            memory.release_free_memory()
            row["rss_trim"] = memory.rss_gb()
        row.update(
            peak=memory.peak_rss_gb(),
            pyobj=len(gc.get_objects()),
            thr=threading.active_count(),
            seq=metrics.get("rollout/sequence_length_mean", float("nan")),
            sampled=metrics.get("rollout/sampled_tokens_mean", float("nan")),
        )
        if tracemalloc.is_tracing():
            row["py_mb"] = tracemalloc.get_traced_memory()[0] / 1e6
            if step == self.options.warmup:
                self.snapshot = tracemalloc.take_snapshot()
        self.rows.append(row)
        if len(self.rows) == 1:
            print(header(row), flush=True)
        print(format_row(row), flush=True)
        self.last = time.perf_counter()


COLUMNS = [
    ("step", "{:>4}"),
    ("seconds", "{:>6.1f}"),
    ("update", "{:>6.1f}"),
    ("rss", "{:>6.3f}"),
    ("rss_trim", "{:>8.3f}"),
    ("peak", "{:>6.3f}"),
    ("heap", "{:>6.3f}"),
    ("free", "{:>6.3f}"),
    ("used", "{:>6.3f}"),
    ("mmap", "{:>6.3f}"),
    ("pyobj", "{:>7}"),
    ("py_mb", "{:>6.1f}"),
    ("thr", "{:>3}"),
    ("seq", "{:>5.0f}"),
    ("sampled", "{:>7.1f}"),
]


def format_row(row: dict[str, Any]) -> str:
    return " ".join(fmt.format(row[key]) for key, fmt in COLUMNS if key in row)


def header(row: dict[str, Any]) -> str:
    widths = {key: len(fmt.format(row[key])) for key, fmt in COLUMNS if key in row}
    return " ".join(key.rjust(width) for key, width in widths.items())


def slope_mb_per_step(rows: list[dict[str, Any]], key: str, warmup: int) -> float:
    """Least-squares slope of ``key`` (GB) over the steps after ``warmup``, in MB per step."""
    points = [(r["step"], r[key]) for r in rows if r["step"] > warmup and key in r]
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 1000 * sum((x - mx) * (y - my) for x, y in points) / sxx


def plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = [r["step"] for r in rows]
    for key in ("rss", "rss_trim", "peak", "heap", "free"):
        if key in rows[0]:
            ax.plot(steps, [r[key] for r in rows], marker=".", label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("GB")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    libc = memory._libc()
    if options.arena_max is not None and libc is not None:
        libc.mallopt(M_ARENA_MAX, options.arena_max)
    if options.mmap_threshold_mb is not None and libc is not None:  # also stops the threshold growing
        libc.mallopt(M_MMAP_THRESHOLD, int(options.mmap_threshold_mb * 2**20))
    if options.kernel_cache is not None:
        memory.limit_kernel_caches(options.kernel_cache)
    if options.tracemalloc:
        tracemalloc.start(25)

    from agentrl.config.train import build_config
    from agentrl.plugins import load_plugins
    from agentrl.training.trainer import Trainer

    out = options.output_dir or tempfile.mkdtemp(prefix="agentrl-memory-")
    run_dir = Path(out) / "run"
    config = build_config(
        None,
        overrides={"max_steps": options.steps, "output_dir": str(run_dir)},
        sets=[
            f"eval_tasks={options.eval_tasks}",
            f"eval_every={options.eval_every}",
            f"checkpoint_every={options.checkpoint_every}",
            "save_model=false",
            *options.sets,
        ],
    )
    switches = [
        f"{k}={v}"
        for k, v in vars(options).items()
        if k in ("trim", "mmap_threshold_mb", "arena_max", "kernel_cache", "gc", "tracemalloc")
        and v not in (None, False)
    ]
    env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k in memory.KERNEL_CACHE_VARIABLES}
    title = (
        f"{config.model} {config.env}/{config.algo} {config.prompts_per_step}x{config.num_generations} "
        f"new={config.max_new_tokens} eval={config.eval_tasks}/{config.eval_every} "
        f"ckpt={config.checkpoint_every} {' '.join(options.sets + switches)} {env or ''}"
    )
    print(title, flush=True)
    t0 = time.perf_counter()
    trainer = Trainer(config, load_plugins())
    print(
        f"built in {time.perf_counter() - t0:.0f} s; rss {memory.rss_gb():.3f} GB, "
        f"torch threads {__import__('torch').get_num_threads()}",
        flush=True,
    )
    recorder = Recorder(options)
    try:
        trainer.train(progress=recorder)
    finally:
        if not options.output_dir:
            shutil.rmtree(out, ignore_errors=True)
    rows = recorder.rows
    print(header(rows[0]))
    for row in rows:
        print(format_row(row))
    last = rows[-1]
    keys = [k for k in ("rss", "rss_trim", "heap", "free", "used", "mmap") if k in last]
    print(
        f"slope over steps {options.warmup + 1}-{last['step']} (MB/step): "
        + ", ".join(f"{k} {slope_mb_per_step(rows, k, options.warmup):+.1f}" for k in keys)
    )
    print(
        f"final rss {last.get('rss_trim', last['rss']):.3f} GB, peak {last['peak']:.3f} GB, "
        f"median {sorted(r['seconds'] for r in rows)[len(rows) // 2]:.1f} s/step"
    )
    if recorder.snapshot is not None:
        print("tracemalloc: biggest Python growth since the warm-up:")
        for stat in tracemalloc.take_snapshot().compare_to(recorder.snapshot, "filename")[:8]:
            print(f"  {stat.size_diff / 1e6:+8.2f} MB {stat.traceback[0].filename}")
    if options.json:
        Path(options.json).write_text(json.dumps({"title": title, "rows": rows}, indent=1))
    if options.plot:
        plot(rows, options.plot, title)
        print(f"plot saved to {options.plot}")


if __name__ == "__main__":
    main()
