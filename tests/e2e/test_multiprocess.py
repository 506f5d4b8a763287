"""Several processes (``agentrl train --num-processes 2``: accelerate launch, gloo on this CPU)
train exactly like one in fp32 (``precision=fp32``, as every run here sets): the same global batch
gives the same weights, metrics and completions. In bf16 only to bf16 rounding: native bf16
kernels round other batch shapes differently (docs/guides/scaling.md has the measured figures).

Each process rolls out whole groups (its share of ``prompts_per_step``), episodes sample from
per-episode seeds (so an episode's tokens do not depend on its process), gradients are summed
with global loss denominators, batch-wide statistics (GRPO ``scale_rewards=batch``, PPO
whitening) go through ``all_sum``, and the LR schedule steps once per optimizer step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_in_process import agentrl_in_process
from safetensors.torch import load_file
from same_episodes import assert_same_completions

REWARD = '''
def vowels(completions, **kwargs):
    """A reward that varies between episodes of a tiny random model: its share of vowels."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]
'''

WEIGHT_TOLERANCE = 1e-5
"""Summing gradients over two processes changes float rounding only: Adam steps of lr=1e-3 land
within this of the one-process weights (measured, PPO 3 steps: 0.0 on an AVX2 AMD EPYC, 8.2e-6 on
an AVX512/AMX Xeon, whose kernels round the all-reduced sums differently; metrics equal on both)."""

FSDP_WEIGHT_TOLERANCE = 1e-5
"""FSDP reduce-scatters each gradient shard (summed in another order than one process sums its
micro-batches). Adam divides a gradient by its own running RMS, so where a gradient is near zero a
rounding-level difference becomes a visible part of a step: 3.75e-6 on 1 of the 2048 weights of one
matrix, after 6 Adam steps of lr=1e-3 (measured on a Xeon, 2026-11-25; 0.0 on another CPU). This
is 1% of one step; a lost or doubled shard moves weights by whole steps (~1e-3)."""


def agentrl(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``agentrl`` CLI in a subprocess (``--num-processes`` launches more processes)."""
    env = {**os.environ, "AGENTRL_LAUNCHED": ""}
    result = subprocess.run(
        [sys.executable, "-m", "agentrl", *args], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def one_process(*args: str) -> None:
    """The one-process reference run, in this process (``cli_in_process``): what the processes are
    compared with needs no process of its own, and skips ~10 s of imports."""
    result = agentrl_in_process(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def common(tiny_model_dir: Path, tmp_path: Path, algo: str, *sets: str) -> list[str]:
    reward = tmp_path / "vowels.py"
    reward.write_text(REWARD)
    args = [
        "train",
        "--env",
        "math",
        "--algo",
        algo,
        "--model",
        str(tiny_model_dir),
        "--prompts-per-step",
        "4",
        "--num-generations",
        "4",
        "--reward",
        f"{reward}:vowels",
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=12",
        "--set",
        "learning_rate=1e-3",
        "--set",
        "precision=fp32",
        "--set",
        "engine_args.dtype=float32",
        "--set",
        "log_completions_every=1",
        "--set",
        "lr_scheduler=cosine",
        "--set",
        "warmup_steps=1",
    ]
    for item in sets:
        args += ["--set", item]
    return args


def weights(run_dir: Path, part: str = "model") -> dict[str, torch.Tensor]:
    return load_file(run_dir / part / "model.safetensors")


def metric_rows(run_dir: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "faults/"))} for row in rows]


def assert_same_run(
    one: Path, two: Path, parts: tuple[str, ...] = ("model",), tolerance: float = WEIGHT_TOLERANCE
) -> None:
    """Weights within ``tolerance``, every metric and completion equal up to float rounding."""
    for part in parts:
        a, b = weights(one, part), weights(two, part)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=tolerance, rtol=0, msg=f"{part}/{key}")
    rows_one, rows_two = metric_rows(one), metric_rows(two)
    assert len(rows_one) == len(rows_two) > 0
    for row_one, row_two in zip(rows_one, rows_two):
        assert row_one.keys() == row_two.keys()
        for key in row_one:
            assert row_two[key] == pytest.approx(row_one[key], rel=1e-5, abs=1e-6), (row_one["step"], key)
    assert_same_completions(one, two)


@pytest.mark.timeout(900)
def test_ppo_async_two_processes_with_resume_equal_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """PPO's critic is a second DDP module and its advantages are whitened over both processes; with
    ``async_steps=2`` each process's rollout thread gathers on a process group of its own beside the
    learner's DDP, and a checkpoint holds each process's sampling state and batches collected ahead:
    the two-process run, and its resume, equal one process. The two processes checkpoint the
    decoder blocks of both DDP modules (``gradient_checkpointing``: DDP's gradient hooks fire
    while the backward pass runs each block's forward again), which changes no gradient."""
    args = common(
        tiny_model_dir,
        tmp_path,
        "ppo",
        "async_steps=2",
        "checkpoint_every=2",
        "algorithm.mini_batches=1",
        "algorithm.ppo_epochs=2",
        "keep_finished_checkpoints=true",
    )  # step 2's stays: resumed below
    one_process(*args, "--max-steps", "4", "--output-dir", str(tmp_path / "one"))
    two = tmp_path / "two"
    launched = agentrl(
        *args,
        "--max-steps",
        "4",
        "--output-dir",
        str(two),
        "--num-processes",
        "2",
        "--set",
        "gradient_checkpointing=true",
    )
    assert "gradient checkpointing: 2 decoder blocks (LlamaDecoderLayer) recomputed" in launched.stdout
    # mismatch/ratio_min|max (stale tokens: not 1) too: the extremes over both processes' tokens
    assert_same_run(tmp_path / "one", two, parts=("model", "critic"))
    assert [row["async/sampling_version"] for row in metric_rows(two)[:4]] == [0.0, 0.0, 0.0, 1.0]
    state = json.loads((two / "checkpoints" / "step-000002" / "state.json").read_text())
    assert [[c["step"] for c in p["async"]["ready"]] for p in state["processes"]] == [[3, 4], [3, 4]]
    # Drop the last step and the final outputs, then resume the two-process run from step 2.
    shutil.rmtree(two / "checkpoints" / "step-000004")
    for leftover in ("model", "critic", "eval.json"):
        path = two / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    agentrl("train", "--resume", str(two), "--num-processes", "2")
    assert_same_run(tmp_path / "one", two, parts=("model", "critic"))
    refused = agentrl_in_process("train", "--resume", str(two))  # refused before it starts: no process needed
    assert refused.returncode == 2 and "written by 2 process(es)" in refused.stderr, refused.stderr[-2000:]


PREAMBLE = (
    "Read this slowly and with great care, because every word of it matters a great deal to the person who is asking: "
)


def mixed_length_questions(path: Path) -> Path:
    """A math data file whose questions are short (a row of about 60 tokens) or long (about 130)."""
    rows = [
        {"question": (PREAMBLE * 3 if i % 2 else "") + f"What is {i} + 3?", "answer": str(i + 3)} for i in range(40)
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


@pytest.mark.timeout(900)
def test_fsdp_two_processes_equal_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``--accelerate-config fsdp`` on this CPU: FSDP2 shards the policy and PPO's critic over gloo,
    each process samples from a replica gathered after every update, and the run equals one process
    (weights of both modules, metrics, completions). Questions of two lengths and a token budget that
    fits one long row or four short ones give the processes different micro-batch counts in a step;
    every forward gathers the shards, so they must run as many (split_to_count). The two processes
    also checkpoint their decoder blocks (``gradient_checkpointing``: the backward pass runs each
    sharded block's forward again), which changes no gradient."""
    data = mixed_length_questions(tmp_path / "questions.jsonl")
    args = common(
        tiny_model_dir,
        tmp_path,
        "ppo",
        "checkpoint_every=1",
        "algorithm.mini_batches=1",
        "algorithm.ppo_epochs=2",
        f"env_args.data_file={data}",
        "micro_batch_tokens=263",
        "keep_finished_checkpoints=true",
    )  # step 2's checkpoint stays: resumed below
    one_process(*args, "--max-steps", "3", "--output-dir", str(tmp_path / "one"))
    two = tmp_path / "two"
    launched = agentrl(
        *args,
        "--max-steps",
        "3",
        "--output-dir",
        str(two),
        "--num-processes",
        "2",
        "--accelerate-config",
        "fsdp",
        "--set",
        "gradient_checkpointing=true",
    )
    assert "2 processes (FSDP): weights sharded" in launched.stdout
    # the blocks' own class, named through FSDP's class around it
    assert "gradient checkpointing: 2 decoder blocks (LlamaDecoderLayer) recomputed" in launched.stdout
    assert_same_run(tmp_path / "one", two, parts=("model", "critic"), tolerance=FSDP_WEIGHT_TOLERANCE)
    long_groups: dict[tuple[int, int], int] = {}  # (step, process) -> groups with a long question
    for line in (two / "completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        key = (row["step"], row["group"] // 2)  # 4 groups a step, 2 per process, in order
        long_groups[key] = long_groups.get(key, 0) + (PREAMBLE in row["messages"][0]["content"]) / 4
    assert any(long_groups[(step, 0)] != long_groups[(step, 1)] for step in (1, 2, 3)), long_groups
    # Checkpoints hold whole states (gathered from the shards): resume from step 2, sharded again.
    state = json.loads((two / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert state["sharded"] is True
    shutil.rmtree(two / "checkpoints" / "step-000003")
    for leftover in ("model", "critic", "eval.json"):
        path = two / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    agentrl("train", "--resume", str(two), "--num-processes", "2", "--accelerate-config", "fsdp")
    assert_same_run(tmp_path / "one", two, parts=("model", "critic"), tolerance=FSDP_WEIGHT_TOLERANCE)
    refused = agentrl_in_process("train", "--resume", str(two))  # refused before it starts: no process needed
    assert refused.returncode == 2 and "resume it with --accelerate-config fsdp" in refused.stderr, refused.stderr[
        -2000:
    ]


def test_groups_must_split_evenly_over_the_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = agentrl_in_process(  # refused before anything is launched: no process needed
        "train",
        "--model",
        str(tiny_model_dir),
        "--prompts-per-step",
        "3",
        "--num-processes",
        "2",
        "--output-dir",
        str(tmp_path / "run"),
    )
    assert result.returncode == 2
    assert "prompts_per_step=3 does not split over 2 processes" in result.stderr
    assert not (tmp_path / "run").exists()


SLOW_ON_RANK_1 = '''
import os, time
from pathlib import Path
CALLS = []

def vowels(completions, **kwargs):
    """The vowel share; on process 1 the second call (step 2) first marks MARKER and waits, so
    that process 0 is already inside the step's collectives when Ctrl-C comes."""
    CALLS.append(1)
    if os.environ.get("RANK") == "1" and len(CALLS) == 2:
        Path(MARKER).write_text("scoring")
        time.sleep(6)
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]
'''


@pytest.mark.timeout(900)
def test_ctrl_c_stops_every_process_at_one_step_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Ctrl-C in a terminal (SIGINT to the launcher's process group) while the processes are in
    different phases of step 2 (process 1 still scoring, process 0 already waiting in the step's
    collectives): every process stops at the same step boundary, the last complete step is saved,
    the exit status is 130, and ``--resume`` continues to the same result as one process: weights,
    metrics (GRPO's batch-wide reward scale summed over both processes, the LR schedule stepped once
    per optimizer step) and completions."""
    marker = tmp_path / "scoring"
    args = common(tiny_model_dir, tmp_path, "grpo", "algorithm.scale_rewards=batch", "checkpoint_every=0")
    reward = tmp_path / "slow.py"
    reward.write_text(f"MARKER = {str(marker)!r}\n" + SLOW_ON_RANK_1)
    args[args.index(f"{tmp_path / 'vowels.py'}:vowels")] = f"{reward}:vowels"
    one_process(*args, "--max-steps", "3", "--output-dir", str(tmp_path / "one"))
    base = load_file(tiny_model_dir / "model.safetensors")
    trained = weights(tmp_path / "one")
    assert max(float((trained[k] - base[k]).abs().max()) for k in base) > 1e-4  # the steps moved the weights
    two = tmp_path / "two"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "agentrl", *args, "--max-steps", "3", "--output-dir", str(two), "--num-processes", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTRL_LAUNCHED": ""},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not marker.exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "process 1 never reached step 2's scoring"
        time.sleep(2)  # process 0 is past its own rollout, waiting for process 1
        os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 130, out[-3000:] + err[-3000:]
    assert "launching 2 processes" in out and "interrupted after step 1" in err, out[-3000:] + err[-3000:]
    assert (two / "checkpoints" / "step-000001" / "COMPLETE").exists()
    assert [row["step"] for row in metric_rows(two)] == [1]
    agentrl("train", "--resume", str(two), "--num-processes", "2")
    assert_same_run(tmp_path / "one", two)
    lrs = [row["train/learning_rate"] for row in metric_rows(two)]
    assert lrs[:2] == [0.0, pytest.approx(1e-3)]  # warm-up step 0, then once per optimizer step


def test_a_config_error_found_by_every_process_is_one_line(tiny_model_dir, tmp_path):
    """Each launched process finds the same config error: the run prints it once, with no
    launcher lines or traceback around it, and exits 2."""
    result = subprocess.run(
        [sys.executable, "-m", "agentrl", "train", "--model", str(tiny_model_dir), "--algo", "gspo"]
        + ["--num-processes", "2", "--max-steps", "1", "--prompts-per-step", "2", "--num-generations", "2"]
        + ["--output-dir", str(tmp_path / "run"), "--set", "eval_tasks=0"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "AGENTRL_LAUNCHED": ""},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: algorithm 'gspo' asks for 4 mini-batches but a rollout batch has only 2 episodes "
        "(prompts_per_step x num_generations, over 2 process(es)): lower the mini-batch count"
    ]
