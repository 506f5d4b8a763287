"""Choices of docs/reference/capabilities.md with ``--num-processes 2`` (DDP over gloo on this CPU):
GSPO with a LoRA adapter on an ``openai_agent`` rollout in two processes trains like one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_in_process import agentrl_in_process
from safetensors.torch import load_file
from same_episodes import assert_same_completions

pytest.importorskip("peft")

AGENT = """
def solve(task, client):
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    return float(len(reply.choices[0].message.content) % 2)
"""
"""An agent program of one call, rewarded by the parity of its reply's length (a spread in each group)."""

WEIGHT_TOLERANCE = 1e-5
"""Summing gradients over two processes changes float rounding only (the bound tests/e2e/test_multiprocess.py
measures); a lost or doubled gradient moves an Adam step of lr=1e-2 by ~1e-2."""


def _weights(run_dir: Path, part: str) -> dict[str, torch.Tensor]:
    return {k: v for file in sorted((run_dir / part).glob("*.safetensors")) for k, v in load_file(file).items()}


def _rows(run_dir: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


@pytest.mark.timeout(900)
def test_gspo_with_lora_and_an_agent_in_two_processes_equals_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Only the adapter is a DDP parameter (the base is frozen), each process's engine samples the
    merged weights after every update, GSPO's sequence ratios need nothing across processes, each
    process serves its agents on an endpoint of its own: the adapter, the merged model, every
    metric and every completion equal one process's."""
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    args = [
        "train",
        "--env",
        "math",
        "--algo",
        "gspo",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--reward",
        "agentrl.testing:parity_reward",
    ]
    for item in (
        "eval_tasks=0",
        "max_new_tokens=8",
        "learning_rate=1e-2",
        "precision=fp32",
        "engine_args.dtype=float32",
        "log_completions_every=1",
        "lora.r=4",
        "algorithm.mini_batches=1",  # more are shuffled within each process: other mini-batches than one process's
        "rollout=openai_agent",
        f"plugins.openai_agent.agent={agent}:solve",
    ):
        args += ["--set", item]
    one, two = tmp_path / "one", tmp_path / "two"
    result = agentrl_in_process(*args, "--output-dir", str(one))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    launched = subprocess.run(
        [sys.executable, "-m", "agentrl", *args, "--output-dir", str(two), "--num-processes", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "AGENTRL_LAUNCHED": ""},
    )
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    assert "2 processes (MULTI_CPU): weights replicated" in launched.stdout
    adapter = _weights(two, "adapter")
    assert any(".lora_B." in key and bool(tensor.abs().max() > 0) for key, tensor in adapter.items())  # it trained
    for part in ("adapter", "model"):
        a, b = _weights(one, part), _weights(two, part)
        assert a and a.keys() == b.keys(), part
        for key in a:
            torch.testing.assert_close(b[key], a[key], atol=WEIGHT_TOLERANCE, rtol=0, msg=f"{part}/{key}")
    rows_one, rows_two = _rows(one), _rows(two)
    assert [row["step"] for row in rows_two] == [1, 2]
    for row_one, row_two in zip(rows_one, rows_two, strict=True):
        assert row_one.keys() == row_two.keys()
        for key in row_one:
            assert row_two[key] == pytest.approx(row_one[key], rel=1e-5, abs=1e-6), (row_one["step"], key)
    assert rows_two[0]["train/grad_norm"] > 0 and "clip/region" in rows_two[0]  # step 1 moved the adapter
    assert all(row["rollout/turns_mean"] == 1.0 for row in rows_two)  # the agent's one call
    # so step 2 was sampled from the merged weights after step 1, in each process as in one
    assert_same_completions(one, two)
