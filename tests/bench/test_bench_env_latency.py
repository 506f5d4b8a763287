"""``bench/env_latency.py --tiny``: the lockstep loops and the per-episode rollout run side by side and
sample the same tokens (the figures themselves are meaningless on the tiny model)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "env_latency.py"


def test_the_env_latency_bench_runs_every_loop_with_the_same_tokens():
    result = subprocess.run([sys.executable, str(BENCH), "--tiny"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("L=")]
    expected = [
        f"L={latency} {kind} {loop}:"
        for latency, kind in (("0", "fixed"), ("0.05", "fixed"), ("0.05", "uniform(0, 2L)"))
        for loop in ("lockstep serial", "lockstep at once", "per episode")
    ]
    assert [line.split(":")[0] + ":" for line in lines] == expected
    rows = [row for row in result.stdout.splitlines() if row.startswith("│")]
    assert len(rows) == 9 and all(row.rstrip("│ ").endswith("yes") for row in rows), rows
