"""``agentrl compare``: real tiny runs side by side. A run extended with ``--resume`` is identical
to the straight one but for ``perf/*``; another seed differs, and the first step and metric where
it does are named; ``--tolerance``, ``--check``, ``--png``; bad input is one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_in_process import agentrl_in_process, assert_one_line, cli

from agentrl.rundir.compare import compare_figure, is_timing, load_run
from agentrl.testing import LOCKSTEP_ARGS

LENGTH_REWARD = (
    "def reply_length(completions, **kwargs):\n    return [len(c[-1]['content']) / 100 for c in completions]\n"
)
"""A reward that varies on a random model's replies (its math rewards are all 0: nothing would train)."""


def _train(tiny_model_dir: Path, out: Path, reward: Path, *extra: str) -> None:
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--output-dir",
        str(out),
        "--reward",
        f"{reward}:reply_length",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        *("--set", "max_new_tokens=8", "--set", "eval_tasks=2", "--set", "learning_rate=1e-3"),
        *("--set", "lr_scheduler=constant", "--set", "checkpoint_every=1", "--set", "log_completions_every=1"),
        *("--set", "keep_finished_checkpoints=true", "--set", "save_model=false"),
        *LOCKSTEP_ARGS,
        *extra,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Three 2-step runs: ``straight``; ``resumed`` (1 step, then ``--resume --max-steps 2``); ``seed1``."""
    root = tmp_path_factory.mktemp("compare")
    reward = root / "length_reward.py"
    reward.write_text(LENGTH_REWARD)
    out = {name: root / name for name in ("straight", "resumed", "seed1")}
    _train(tiny_model_dir, out["straight"], reward, "--max-steps", "2")
    _train(tiny_model_dir, out["resumed"], reward, "--max-steps", "1")
    resumed = agentrl_in_process("train", "--resume", str(out["resumed"]), "--max-steps", "2")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    _train(tiny_model_dir, out["seed1"], reward, "--max-steps", "2", "--set", "seed=1")
    return out


def _flat(output: str) -> str:
    """``output`` with the table's rules gone and whitespace runs as one space."""
    return " ".join(re.sub(r"[│┃┡┩━─┼╇┏┓┗┛└┘┌┐├┤┳┻┬┴╋]", " ", output).split())


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_is_identical_to_the_straight_one_except_perf(runs):
    straight, resumed = _rows(runs["straight"]), _rows(runs["resumed"])
    assert straight[0]["perf/step_seconds"] != resumed[0]["perf/step_seconds"]  # timings differ: left out
    result = agentrl_in_process("compare", str(runs["straight"]), str(runs["resumed"]), "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = {k for row in straight for k in row if k != "step" and not k.startswith("perf/")}
    episodes = len((runs["straight"] / "completions.jsonl").read_text().splitlines())
    assert episodes == 8  # 2 steps of 2 prompts x 2 generations
    said = _flat(result.stdout)
    assert f"identical except perf/* (2 steps, {len(metrics)} metrics, 8 episodes in completions.jsonl)" in said
    assert re.search(r"held-out accuracy before -> after [\d.]+ -> [\d.]+ [\d.]+ -> [\d.]+", said), said
    last = straight[1]["reward/total_mean"]
    assert re.search(rf"reward/total_mean 1 \S+ \S+ 2 {last:.6g} {last:.6g}", said), said


def test_another_seed_is_named_at_its_first_differing_step_and_metric(runs):
    a, b = _rows(runs["straight"])[0], _rows(runs["seed1"])[0]
    first = min(k for k in a.keys() | b.keys() if not is_timing(k) and a.get(k) != b.get(k))
    checked = agentrl_in_process("compare", str(runs["straight"]), str(runs["seed1"]), "--check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    said = _flat(checked.stdout)
    assert f"first difference at step 1: {first} {a[first]!r} vs {b[first]!r}" in said, said
    assert "completions.jsonl differs at episode 1 (step 1, group 0)" in said, said
    assert agentrl_in_process("compare", str(runs["straight"]), str(runs["seed1"])).returncode == 0  # no --check


def test_tolerance_forgives_a_nudge_exact_does_not(runs, tmp_path):
    nudged = tmp_path / "nudged"
    shutil.copytree(runs["straight"], nudged, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    rows = _rows(nudged)
    rows[1]["loss/total"] += 1e-12
    (nudged / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    exact = agentrl_in_process("compare", str(runs["straight"]), str(nudged), "--check", "--metric", "loss/*")
    assert exact.returncode == 1
    assert "first difference at step 2: loss/total" in _flat(exact.stdout)
    loose = agentrl_in_process(
        "compare", str(runs["straight"]), str(nudged), "--check", "--tolerance", "1e-9", "--metric", "loss/total"
    )
    assert loose.returncode == 0 and "identical except perf/*" in loose.stdout, loose.stdout


def test_a_run_cut_short_differs_at_the_step_it_lacks(runs, tmp_path):
    short = tmp_path / "short"
    short.mkdir()
    (short / "metrics.jsonl").write_text(json.dumps(_rows(runs["straight"])[0]) + "\n")
    result = agentrl_in_process("compare", str(runs["straight"]), str(short), "--check")
    assert result.returncode == 1
    assert "first difference at step 2: only straight logged it" in _flat(result.stdout), result.stdout


def test_three_runs_are_each_checked_against_the_first(runs):
    result = agentrl_in_process("compare", *(str(runs[n]) for n in ("straight", "resumed", "seed1")), "--all")
    said = result.stdout
    assert result.returncode == 0
    assert re.search(r"^resumed vs straight: identical except perf/\*", said, re.M), said
    assert re.search(r"^seed1 vs straight: first difference at step 1:", said, re.M), said
    assert "perf/step_seconds" in said and "final/eval/accuracy" in said  # --all shows every metric


def test_png_overlays_the_runs_one_panel_per_metric(runs, tmp_path):
    from PIL import Image

    out = tmp_path / "cmp.png"
    metrics = ["reward/total_mean", "loss/total", "policy/entropy", "train/grad_norm"]
    flags = [f for m in metrics for f in ("--metric", m)]
    result = agentrl_in_process("compare", str(runs["straight"]), str(runs["seed1"]), *flags, "--png", str(out))
    assert result.returncode == 0 and f"wrote {out}" in _flat(result.stdout), result.stdout
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (3 * 5 * 90, 2 * 4 * 90)  # 3 panels a row, 2 rows
    fig = compare_figure([load_run(runs["straight"]), load_run(runs["seed1"])], metrics)
    assert [ax.get_title() for ax in fig.axes] == metrics
    assert all(len(ax.lines) == 2 for ax in fig.axes)  # a line per run


def test_timing_keys_are_left_out_of_the_identity_check():
    for key in ("perf/step_seconds", "final/perf/rss_gb", "eval/seconds", "env/steps_per_second", "x/memory_mb"):
        assert is_timing(key), key
    for key in ("loss/total", "eval/accuracy", "final/eval/accuracy", "train/learning_rate"):
        assert not is_timing(key), key


def test_bad_input_is_one_line(runs, tmp_path):
    straight = str(runs["straight"])
    (tmp_path / "empty").mkdir()
    assert_one_line(cli("compare", straight, str(tmp_path / "empty")), "is not a run dir: it has no metrics.jsonl")
    assert_one_line(cli("compare", straight, str(tmp_path / "gone")), "is not a run dir: it does not exist")
    line = assert_one_line(cli("compare", straight, straight, "--metric", "reward/totl_mean"), "--metric")
    assert "'reward/totl_mean': none of the runs logged it (close: reward/total_mean" in line
    assert_one_line(cli("compare", straight), "needs two or more run dirs, got 1")
    assert_one_line(cli("compare", straight, straight, "--tolerance", "-1"), "--tolerance -1.0: must be")
    assert_one_line(cli("compare", straight, straight, "--png", str(tmp_path / "no" / "x.png")), "does not exist")
