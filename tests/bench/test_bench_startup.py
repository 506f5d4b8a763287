"""``bench/startup.py``: it times each CLI command it names, and refuses a command that does not end
as it must (a misspelt env that no longer says "did you mean", a crash), so a figure is never the
time of a failure."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "startup.py"


def test_the_startup_bench_times_the_bad_env_command():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--repeats", "1", "--only", "bad-env"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.startswith("bad-env: median ") and "python -m agentrl train --env maths" in result.stdout


def test_a_command_that_ends_otherwise_is_refused():
    spec = importlib.util.spec_from_file_location("startup_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit, match="exit 0 \\(wanted 2\\)"):
        bench.time_command(["-c", "print('fine')"], 2, "fine")
    with pytest.raises(SystemExit, match="output lacks 'did you mean'"):
        bench.time_command(["-c", "print('fine')"], 0, "did you mean")
