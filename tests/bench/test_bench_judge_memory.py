"""``bench/judge_memory.py --tiny``: both judge configurations train through the CLI and report their figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "judge_memory.py"


def test_tiny_bench_reports_memory_time_and_judge_counters_for_both_judges(tmp_path):
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "a second copy as the judge:" in result.stdout
    report = json.loads((out / "judge_memory.json").read_text())
    assert (report["steps"], report["tiny"]) == (1, True)
    policy, copy = report["rows"]
    assert policy["reward"] == "judge:policy"
    assert copy["reward"] == f"judge:{out / 'judge-model'}" and (out / "judge-model" / "config.json").is_file()
    for row in (policy, copy):
        assert row["steps"] == 1 and row["wall_s"] > row["step_s_per_step"] > 0
        assert row["step_s_per_step"] >= row["rollout_s_per_step"] + row["update_s_per_step"] - 1e-6
        assert row["peak_rss_mib"] >= row["trainer_peak_rss_mib"] > 100  # wait4's peak covers every step's
        assert row["judged"] > 0 and row["errors"] == 0
        assert row["judged"] + row["cache_hits"] == report["episodes_per_step"]  # every episode went to the judge
        assert 0 <= row["parse_failures"] <= report["episodes_per_step"] and 0 <= row["parse_rate"] <= 1
        assert row["parse_rate"] == 1 - row["parse_failures"] / report["episodes_per_step"]
        assert row["judge_score_mean"] is None or 0 <= row["judge_score_mean"] <= 1
        printed = next(line for line in result.stdout.splitlines() if row["config"] in line)  # its table row
        assert f"{row['peak_rss_mib']:.0f}" in printed and f"{row['parse_rate']:.3f}" in printed
        lines = (Path(row["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[0])["judge/judged"] == row["judged"]  # the counters come from the run itself
