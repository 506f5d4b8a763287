"""``bench/async_steps.py --tiny``: synchronous and asynchronous training side by side, with the
asynchronous run's tokens one version stale, and a run with partial rollouts (the figures
themselves mean nothing on the tiny model)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "async_steps.py"


def test_the_async_bench_times_every_configuration():
    result = subprocess.run([sys.executable, str(BENCH), "--tiny"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = re.findall(r"^L=(\S+) async_steps=(\d): ([\d.]+) steps/hour, .* staleness ([\d.]+)$", result.stdout, re.M)
    assert [(latency, n) for latency, n, _, _ in lines] == [("0", "0"), ("0", "1"), ("0.05", "0"), ("0.05", "1")]
    assert all(float(rate) > 0 for _, _, rate, _ in lines)
    assert [float(stale) for _, _, _, stale in lines] == [0.0, 1.0, 0.0, 1.0]  # step 3 of 3 trains version 1's episodes
    partial = re.findall(
        r"^L=0.05 async_steps=1\+partial: ([\d.]+) steps/hour, .* staleness ([\d.]+)$", result.stdout, re.M
    )
    assert len(partial) == 1 and float(partial[0][0]) > 0 and 0 <= float(partial[0][1]) <= 1  # timing decides
