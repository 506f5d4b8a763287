"""``bench/learning.py``: multi-seed summaries of hand-written run dirs, and the resumable ``run`` loop."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "learning.py"


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_learning", BENCH)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr] - dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


learning = load_bench()


def write_run(
    root: Path,
    name: str,
    step_seconds: float,
    greedy: tuple[float, float, float],
    fmt: tuple[float, float, float] | None = None,
    sampled: bool = True,
) -> Path:
    """A 4-step run dir evaluated at steps 0, 2 and 4 (the end)."""
    run = root / name
    run.mkdir()
    (run / "config.yaml").write_text("max_steps: 4\neval_every: 2\n")

    def evals(i: int) -> dict[str, Any]:
        out: dict[str, Any] = {"eval/accuracy": greedy[i]}
        if sampled:
            out["eval/accuracy_sampled"] = greedy[i] / 2
        if fmt is not None:  # the env's boxed rate wins over the format reward's mean
            out.update({"eval/env/boxed": fmt[i], "eval/format_mean": 0.01})
        return out

    lines = [{"step": s, "perf/step_seconds": step_seconds, "reward/total_mean": None} for s in range(1, 5)]
    lines[1].update(evals(1))
    lines.append({"step": 4, "final/eval/accuracy": 0.99, "perf/step_seconds": 1000.0})  # ignored
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run / "eval.json").write_text(json.dumps({"before": evals(0), "after": evals(2)}))
    return run


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    root = tmp_path / "results"
    root.mkdir()
    (root / "good-s0.log").write_text("not a run dir\n")
    # good: minutes at steps 0/2/4 are 0/2/4 (s0), 0/3/6 (s1), 0/1/2 (s2)
    good = [
        write_run(root, "good-s0", 60, (0.1, 0.3, 0.5), (0.5, 0.8, 0.95)),
        write_run(root, "good-s1", 90, (0.2, 0.4, 0.4), (0.5, 0.8, 0.9)),
        write_run(root, "good-s2", 30, (0.0, 0.5, 0.3), (0.5, 0.8, 1.0)),
    ]
    (good[0] / "bench.json").write_text(json.dumps({"seed": 0, "wall_seconds": 600.0, "returncode": 0}))
    bad = [
        write_run(root, "bad-s0", 60, (0.1, 0.2, 0.3), sampled=False),
        write_run(root, "bad-s1", 60, (0.3, 0.3, 0.2), sampled=False),
    ]
    return [root / "good-s0.log", *good, *bad]


def row(config: dict[str, Any], label: str) -> dict[str, Any]:
    return next(r for r in config["rows"] if r["label"] == label)


def stat(r: dict[str, Any], field: str) -> tuple[float, float, float]:
    return r[field]["mean"], r[field]["min"], r[field]["max"]


def test_grouping_strips_the_seed_suffix() -> None:
    assert learning.config_name("math-grpo-s12") == "math-grpo"
    assert learning.config_name("math-grpo-s1x") == "math-grpo-s1x"
    assert learning.config_name("seeds") == "seeds"


def test_report_numbers(runs: list[Path]) -> None:
    loaded = [learning.load_run(p) for p in runs if learning.is_run_dir(p)]
    report = learning.build_report(loaded, [0.5, 3])
    assert list(report) == ["good", "bad"]
    good, bad = report["good"], report["bad"]
    assert [r["label"] for r in good["rows"]] == [
        "before (step 0)",
        "step 2",
        "end (step 4)",
        "best",
        "at 0.5 min",
        "at 3 min*",
    ]
    assert stat(row(good, "before (step 0)"), "greedy") == pytest.approx((0.1, 0.0, 0.2))
    assert stat(row(good, "step 2"), "greedy") == pytest.approx((0.4, 0.3, 0.5))
    assert stat(row(good, "step 2"), "sampled") == pytest.approx((0.2, 0.15, 0.25))
    assert stat(row(good, "step 2"), "minutes") == pytest.approx((2.0, 1.0, 3.0))
    end = row(good, "end (step 4)")
    assert stat(end, "greedy") == pytest.approx((0.4, 0.3, 0.5))
    assert stat(end, "format") == pytest.approx((0.95, 0.9, 1.0))  # eval/env/boxed, not format_mean
    assert stat(end, "minutes") == pytest.approx((4.0, 2.0, 6.0))  # the final/ line is not counted
    # best: s0 0.5 at its end (4 min), s1 0.4 first at step 2 (3 min), s2 0.5 at step 2 (1 min)
    assert stat(row(good, "best"), "greedy") == pytest.approx((1.4 / 3, 0.4, 0.5))
    assert stat(row(good, "best"), "minutes") == pytest.approx((8 / 3, 1.0, 4.0))
    assert stat(row(good, "at 0.5 min"), "greedy") == pytest.approx((0.1, 0.0, 0.2))
    # at 3 min: s0 step 2 (0.3), s1 step 2 at exactly 3 min (0.4), s2 ended at 2 min: its end (0.3)
    at3 = row(good, "at 3 min*")
    assert stat(at3, "greedy") == pytest.approx((1.0 / 3, 0.3, 0.4))
    assert stat(at3, "minutes") == pytest.approx((7 / 3, 2.0, 3.0))
    assert "s2 ended at 2.0 min" in at3["note"] and good["footnotes"] == [
        "* at 3 min: s2 ended at 2.0 min (their end values are used)"
    ]
    v = good["verdicts"]
    assert v["greedy_improved_every_seed"] is True and v["format_ok_every_seed"] is True
    assert v["greedy_deltas"] == pytest.approx({"s0": 0.4, "s1": 0.2, "s2": 0.3})
    assert v["wall_seconds"] == {"s0": 600.0}
    assert bad["has_format"] is False and bad["verdicts"]["format_ok_every_seed"] is None
    assert bad["verdicts"]["greedy_improved_every_seed"] is False
    assert bad["verdicts"]["greedy_deltas"] == pytest.approx({"s0": 0.2, "s1": -0.1})
    assert row(bad, "end (step 4)")["sampled"]["mean"] is None and bad["footnotes"] == []


def test_report_cli_writes_png_and_json(runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, out = tmp_path / "plot.png", tmp_path / "report.json"
    argv = ["report", *map(str, runs), "--png", str(png), "--json", str(out), "--minutes", "0.5", "3"]
    assert learning.main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    report = json.loads(out.read_text())
    assert stat(row(report["good"], "step 2"), "greedy") == pytest.approx((0.4, 0.3, 0.5))
    assert [s["seed"] for s in report["good"]["seeds"]] == ["s0", "s1", "s2"]
    assert [p["greedy"] for p in report["bad"]["seeds"][1]["points"]] == [0.3, 0.3, 0.2]
    text = capsys.readouterr().out
    assert "greedy end > start on every seed: yes" in text and "greedy end > start on every seed: no" in text
    assert "format at end >= 0.9 on every seed: yes" in text and "0.400 [0.300, 0.500]" in text
    # the default PNG goes next to the run dirs
    assert learning.main(["report", *map(str, runs[1:3])]) == 0
    assert (runs[1].parent / "learning.png").stat().st_size > 0


def test_an_empty_panel_says_why(runs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bad`` has neither a sampled evaluation nor a format metric: those panels say so, not blank."""
    import matplotlib.figure

    figures: list[Any] = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))
    report = learning.build_report([learning.load_run(p) for p in runs if p.name.startswith("bad-")], [])
    learning.write_plot(report, tmp_path / "plot.png")
    texts = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in figures[0].axes}
    assert texts["held-out accuracy (sampled) by step"] == ["no sampled evaluation\n(the runs had eval_sampled: false)"]
    assert texts["format rate (boxed answers) by step"] == ["no format metric logged"]
    assert texts["held-out accuracy (greedy) by step"] == []  # it has data


FAKE_TRAIN = """
import json, sys
from pathlib import Path
seed, run = int(sys.argv[1]), Path(sys.argv[2])
run.mkdir()  # like agentrl train: refuses an existing output dir
with open(run.parent / "calls.txt", "a") as f:
    f.write(f"{seed}\\n")
if (run.parent / f"fail-{seed}").exists():
    print("boom: training failed")
    sys.exit(3)
(run / "metrics.jsonl").write_text(json.dumps({"step": 1, "perf/step_seconds": 6.0}) + "\\n")
(run / "eval.json").write_text(json.dumps({"before": {"eval/accuracy": 0.1}, "after": {"eval/accuracy": 0.2}}))
"""


def test_run_resumes_and_reports_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "learning"
    monkeypatch.setattr(learning, "POLL_SECONDS", 0.02)
    monkeypatch.setattr(
        learning,
        "train_command",
        lambda seed, run_dir, extra: [sys.executable, "-c", FAKE_TRAIN, str(seed), str(run_dir)],
    )
    out.mkdir()
    (out / "x-s0").mkdir()  # left by an interrupted run: deleted and trained again
    (out / "fail-1").touch()
    assert learning.main(["run", "--name", "x", "--seeds", "0", "1", "--out", str(out), "--", "--steps", "1"]) == 1
    bench = json.loads((out / "x-s1" / "bench.json").read_text())
    assert bench["returncode"] == 3 and bench["seed"] == 1 and bench["args"] == ["--steps", "1"]
    assert json.loads((out / "x-s0" / "bench.json").read_text())["returncode"] == 0
    assert "boom: training failed" in capsys.readouterr().out
    (out / "fail-1").unlink()
    assert learning.main(["run", "--name", "x", "--seeds", "0", "1", "--out", str(out)]) == 0
    assert (out / "calls.txt").read_text().split() == ["0", "1", "1"]  # seed 0 was not trained again
    assert (out / "x.png").stat().st_size > 0 and json.loads((out / "x.json").read_text())["x"]["rows"]
