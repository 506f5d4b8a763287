"""``bench/viewer_load.py``: on a small synthetic run it writes the page, opens it in headless
Chromium and prints each figure; its filter finds the episodes a Python filter finds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_viewer_bench_prints_its_figures(tmp_path):
    if not Path("/usr/bin/chromium").is_file() and os.environ.get("AGENTRL_REQUIRE_BROWSER") != "1":
        pytest.skip("no headless browser: /usr/bin/chromium is missing (apt-get install chromium)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins"), str(ROOT / "envs")])}
    command = [sys.executable, str(ROOT / "bench" / "viewer_load.py"), "--episodes", "300", "--keep", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"^300 episodes: page [\d.]+ MB, built in [\d.]+ s$", out, flags=re.M), out
    assert re.search(r"^load \(until viewerReady\): [\d.]+ s; episodes tab: [\d.]+ s$", out, flags=re.M), out
    assert re.search(r"^open one episode: [\d.]+ s \(\d+ token spans\)$", out, flags=re.M), out
    episodes = [json.loads(line) for line in (tmp_path / "synthetic" / "completions.jsonl").read_text().splitlines()]
    matches = [
        e
        for e in episodes
        if e["reward"] is not None
        and e["reward"] >= 0.5
        and "python error" in " ".join(m["content"] for m in e["messages"]).lower()
    ]
    assert f", {len(matches)} matches)" in out
