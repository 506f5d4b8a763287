"""``agentrl plot``: one PNG per run, with a panel for the env's own figures when it logs any."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image

from agentrl.plots import plot_run


def write_run(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_env_figures_get_their_own_panel(tmp_path: Path) -> None:
    plain = [{"step": s, "reward/total_mean": s / 10, "rollout/turns_mean": 1.0} for s in range(1, 6)]
    with_env = [{**r, "env/consistent_frac": r["step"] / 5} for r in plain]
    narrow = matplotlib.image.imread(plot_run(write_run(tmp_path / "plain", plain)))
    wide = matplotlib.image.imread(plot_run(write_run(tmp_path / "env", with_env)))
    assert narrow.shape[:2] == (8 * 90, 15 * 90) and wide.shape[:2] == (8 * 90, 20 * 90)
