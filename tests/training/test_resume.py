"""Checkpoints and resume: N steps straight == N/2 + resume + N/2 bit for bit; Ctrl-C saves;
SIGKILL at any moment leaves a usable checkpoint and a clean metrics.jsonl; K non-finite steps stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_in_process import agentrl_in_process
from safetensors.torch import load_file

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, TrainingError, TrainingInterrupted
from agentrl.plugins import load_plugins
from agentrl.rundir.checkpoints import complete_checkpoints, latest_checkpoint
from agentrl.rundir.directory import resume_config
from agentrl.rundir.saved import weights_folder
from agentrl.testing import LOCKSTEP_ARGS, lockstep_plugins
from agentrl.training.trainer import Trainer

# A step-hook plugin with state of its own (a counter logged every step): resume must carry it on.
COUNTER_PLUGIN = """
import os, signal
from agentrl import hookimpl

calls = {"n": 0}
STOP_AT = int(os.environ.get("AGENTRL_TEST_SIGINT_AT", "0"))

@hookimpl
def agentrl_on_step_end(step, metrics):
    calls["n"] += 1
    metrics["custom/calls"] = float(calls["n"])
    if step == STOP_AT and os.environ.get("AGENTRL_TEST_SIGINT_IN") == "update":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the step's update/records are being written

@hookimpl
def agentrl_on_rollout_end(trajectories, step, metrics):
    if step == STOP_AT and os.environ.get("AGENTRL_TEST_SIGINT_IN") == "rollout":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the rollout: nothing of this step is kept

@hookimpl
def agentrl_save_state(state):
    state["counter"] = dict(calls)

@hookimpl
def agentrl_load_state(state):
    calls.update(state["counter"])
"""


def _config(model_dir: Path, out: Path, **overrides) -> TrainConfig:
    base = dict(
        model=str(model_dir),
        max_steps=4,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=4,
        eval_every=2,
        output_dir=str(out),
        log_completions_every=1,
        checkpoint_every=1,
        keep_checkpoints=2,
        lr_scheduler="cosine",
        warmup_steps=1,
        learning_rate=1e-3,
        plugins=lockstep_plugins(),
    )
    base.update(overrides)
    if base["max_steps"] == 1:
        base["warmup_steps"] = 0  # warm-up must end within the run
    return TrainConfig(**base)


def _manager(folder: Path):
    """A fresh copy of the counter plugin (a file per folder: each is its own module)."""
    folder.mkdir()
    plugin = folder / "counter_plugin.py"
    plugin.write_text(COUNTER_PLUGIN)
    return load_plugins(modules=[str(plugin)])


def _lines(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows without the timing figures (which differ between any two runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa and wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


@pytest.mark.parametrize(
    ("algo", "where", "cache_mb"),
    [("grpo", "update", 0), ("grpo", "rollout", 0), ("ppo", "update", 0), ("grpo", "rollout", 64)],
)
def test_interrupted_then_resumed_equals_straight_bit_for_bit(
    tiny_model_dir, tmp_path, monkeypatch, algo, where, cache_mb
):
    """``cache_mb``: with the hf engine's prefix cache, whose entries are not saved: the straight run's
    evaluation at step 2 (just before the checkpoint a resume starts from) fills it, and step 3's
    prompts start with the same chat template."""
    extra = {"algorithm": {"mini_batches": 2, "ppo_epochs": 2}} if algo == "ppo" else {}
    if cache_mb:
        extra["engine_args"] = {"prefix_cache_mb": cache_mb}
    straight = tmp_path / "straight"
    Trainer(_config(tiny_model_dir, straight, algo=algo, **extra), _manager(tmp_path / "a")).train()

    split = tmp_path / "split"
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_AT", "3")
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_IN", where)
    with pytest.raises(TrainingInterrupted) as info:
        Trainer(_config(tiny_model_dir, split, algo=algo, **extra), _manager(tmp_path / "b")).train()
    saved = 3 if where == "update" else 2  # an update completes; a rollout is dropped
    assert info.value.checkpoint == str(split / "checkpoints" / f"step-{saved:06d}")
    assert [row["step"] for row in _lines(split)] == list(range(1, saved + 1))
    assert not (split / "model").exists()  # no final export from an interrupted run

    monkeypatch.delenv("AGENTRL_TEST_SIGINT_AT")
    config, checkpoint = resume_config(split)
    assert checkpoint.name == f"step-{saved:06d}"
    optimizers = torch.load(checkpoint / "optimizers.pt", weights_only=True)
    assert (checkpoint / "model").is_dir() and all(state["state"] for state in optimizers.values())  # whole
    result = Trainer(config, _manager(tmp_path / "c"), resume=checkpoint).train()

    assert _lines(split) == _lines(straight)  # every step once, identical values, plugin counter included
    assert [row["custom/calls"] for row in _lines(split) if "custom/calls" in row] == [1.0, 2.0, 3.0, 4.0]
    _assert_same_weights(straight / "model", split / "model")
    if algo == "ppo":
        _assert_same_weights(straight / "critic", split / "critic")
    for store in ("completions.jsonl", "eval_completions.jsonl"):  # every episode once, as a straight run wrote it
        assert (split / store).read_text() == (straight / store).read_text()
    steps = [json.loads(line)["step"] for line in (split / "completions.jsonl").read_text().splitlines()]
    whens = [json.loads(line)["when"] for line in (split / "eval_completions.jsonl").read_text().splitlines()]
    assert steps == [s for s in range(1, 5) for _ in range(6)]
    assert whens == [w for w in ("before", "step 2", "after") for _ in range(4)]
    assert result.eval_before == json.loads((straight / "eval.json").read_text())["before"]
    assert [p.name for p in complete_checkpoints(split)] == ["step-000004"]  # a finished run keeps its last one


def test_final_export_loads_with_from_pretrained(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    Trainer(_config(tiny_model_dir, out, max_steps=1, eval_tasks=0), load_plugins()).train()
    AutoModelForCausalLM.from_pretrained(out / "model")
    AutoTokenizer.from_pretrained(out / "model")
    checkpoint = complete_checkpoints(out)[-1]
    assert weights_folder(out, checkpoint) == out / "model"  # the finished run's checkpoint: model/ holds its weights


def test_rerun_into_an_existing_run_dir_is_refused(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    Trainer(_config(tiny_model_dir, out, max_steps=1, eval_tasks=0, save_model=False), load_plugins()).train()
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"already holds a run .*--resume"):
        Trainer(_config(tiny_model_dir, out, max_steps=1, eval_tasks=0), load_plugins())
    assert (out / "metrics.jsonl").read_text() == before  # nothing appended
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        Trainer(_config(tiny_model_dir, tmp_path / "file"), load_plugins())


def test_resume_refuses_what_cannot_be_continued(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="not a run dir"):
        latest_checkpoint(tmp_path)
    out = tmp_path / "run"
    Trainer(
        _config(tiny_model_dir, out, max_steps=1, eval_tasks=0, checkpoint_every=0, save_model=False), load_plugins()
    ).train()
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        resume_config(out)
    other = tmp_path / "other"
    Trainer(_config(tiny_model_dir, other, max_steps=2, eval_tasks=0, save_model=False), load_plugins()).train()
    text = (other / "config.yaml").read_text().replace("seed: 0", "seed: 5")
    (other / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match="differs from the checkpoint's config in seed"):
        resume_config(other)
    (other / "config.yaml").write_text(text.replace("seed: 5", "seed: 0"))
    with pytest.raises(ConfigError, match="max_steps 1 is below the checkpoint's step 2"):
        resume_config(other, max_steps=1)
    config, _ = resume_config(other, max_steps=3)  # training longer is allowed
    assert config.max_steps == 3


def test_training_longer_replans_the_wsd_decay(tiny_model_dir, tmp_path):
    """Hand-derived: 2 steps with half decaying run at lr, lr (the decay's first step is still lr);
    resumed to 4 steps, the decay moves to the last 2: lr, lr/2. The saved schedule state is the
    step count; the rates come from the new length."""
    out = tmp_path / "run"
    Trainer(
        _config(
            tiny_model_dir,
            out,
            max_steps=2,
            warmup_steps=0,
            eval_tasks=0,
            save_model=False,
            lr_scheduler="wsd",
            lr_decay_fraction=0.5,
        ),
        load_plugins(),
    ).train()
    config, checkpoint = resume_config(out, max_steps=4)
    Trainer(config, load_plugins(), resume=checkpoint).train()
    rates = [
        json.loads(line)["train/learning_rate"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "train/learning_rate" in json.loads(line)
    ]
    assert rates == pytest.approx([1e-3, 1e-3, 1e-3, 5e-4], abs=1e-12)


NAN_FACTORS = """
import torch
from agentrl import hookimpl

@hookimpl
def agentrl_per_token_loss_factors(batch, logprobs, old_logprobs, config, settings, metrics):
    return torch.full_like(logprobs, float("nan"))
"""


def test_nonfinite_steps_in_a_row_stop_the_run_keeping_what_was_written(tiny_model_dir, tmp_path):
    plugin = tmp_path / "nan_plugin.py"
    plugin.write_text(NAN_FACTORS)
    out = tmp_path / "run"
    trainer = Trainer(
        _config(tiny_model_dir, out, max_steps=10, eval_tasks=0, max_nonfinite_steps=3),
        load_plugins(modules=[str(plugin)]),
    )
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.warns(RuntimeWarning, match="not finite"), pytest.raises(TrainingError, match=r"steps 1-3: 3 steps"):
        trainer.train()
    rows = _lines(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["train/nonfinite_skipped_steps"] == 3.0
    assert all(torch.equal(v, start[k]) for k, v in trainer.model.state_dict().items())  # never stepped
    assert complete_checkpoints(out)[-1].name == "step-000003"


def test_a_batch_with_no_scored_episode_is_not_an_update(tiny_model_dir, tmp_path):
    reward = tmp_path / "unscored.py"
    reward.write_text("def unscored(trajectories):\n    return [None] * len(trajectories)\n")
    out = tmp_path / "run"
    config = _config(
        tiny_model_dir,
        out,
        max_steps=2,
        eval_tasks=0,
        env_reward_weight=0.0,
        rewards={f"{reward}:unscored": 1.0},
        max_nonfinite_steps=5,
        save_model=False,
    )
    trainer = Trainer(config, load_plugins())
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with (
        pytest.warns(RuntimeWarning, match="no episode of the batch has a finite reward"),
        pytest.raises(TrainingError, match="the run trained nothing: 2 of 2 steps had no scored episode"),
    ):
        trainer.train()
    assert all(torch.equal(v, start[k]) for k, v in trainer.model.state_dict().items())  # Adam momentum never ran
    assert [r.get("train/skipped_unscored_batch") for r in _lines(out)] == [1.0, 1.0]


AGENTRL = [sys.executable, "-m", "agentrl.cli.app"]


def _train_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*AGENTRL, "train", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


SLOW_SAVE_PLUGIN = """
import os, time
from pathlib import Path
from agentrl import hookimpl

saves = {"n": 0}

@hookimpl
def agentrl_save_state(state):
    saves["n"] += 1
    ready = os.environ.get("AGENTRL_TEST_SLOW_SAVE")
    if ready and saves["n"] == 3:  # the third checkpoint hangs half-written until killed
        Path(ready).write_text("writing")
        time.sleep(600)
"""


def test_sigkill_mid_checkpoint_then_resume_equals_straight(tiny_model_dir, tmp_path):
    plugin = tmp_path / "slow_save.py"
    plugin.write_text(SLOW_SAVE_PLUGIN)
    common = [
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "5",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--set",
        "max_new_tokens=8",
        "--set",
        "eval_tasks=0",
        "--set",
        "checkpoint_every=1",
        "--set",
        "log_completions_every=1",
        "--plugin",
        str(plugin),
        *LOCKSTEP_ARGS,
    ]
    straight, killed, ready = tmp_path / "straight", tmp_path / "killed", tmp_path / "ready"
    proc = subprocess.Popen(
        [*AGENTRL, "train", *common, "--output-dir", str(killed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTRL_TEST_SLOW_SAVE": str(ready)},
    )
    # The straight run, meanwhile, in this process (the slow save is off here): it is no process's test.
    first = agentrl_in_process("train", *common, "--output-dir", str(straight))
    assert first.returncode == 0, first.stderr[-3000:]
    deadline = time.monotonic() + 300
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1]
    partial = list((killed / "checkpoints").glob(".tmp-step-000003-*"))
    assert partial and (partial[0] / "model").is_dir()  # the model is written, the rest is not
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [r["step"] for r in _lines(killed)] == [1, 2, 3]  # step 3's line came before its checkpoint
    with (killed / "metrics.jsonl").open("a") as f:  # and a torn line, as a kill inside write() leaves
        f.write('{"step": 4, "reward/total_')
    done = agentrl_in_process("train", "--resume", str(killed), "--plugin", str(plugin))
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stdout and "step-000002" in done.stdout
    assert _lines(killed) == _lines(straight)
    assert [r["step"] for r in _lines(killed)] == [1, 2, 3, 4, 5]
    _assert_same_weights(straight / "model", killed / "model")
    assert not list((killed / "checkpoints").glob(".tmp-*"))


def test_ctrl_c_on_the_cli_saves_and_exits_130_and_flags_conflict_with_resume(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _train_cli(
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "50",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--set",
        "max_new_tokens=8",
        "--set",
        "eval_tasks=0",
        "--set",
        "checkpoint_every=0",
        "--output-dir",
        str(out),
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (
        (out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().count("\n") >= 2
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted after step" in err and f"--resume {out}" in err
    assert [r["step"] for r in _lines(out)] == list(range(1, len(_lines(out)) + 1))
    step = len(_lines(out))
    assert complete_checkpoints(out)[-1].name == f"step-{step:06d}"  # saved although checkpoint_every=0
    bad = agentrl_in_process("train", "--resume", str(out), "--seed", "3")  # refusals: no process of their own
    assert bad.returncode == 2 and "drop --seed" in bad.stderr
    again = agentrl_in_process("train", "--output-dir", str(out), "--model", str(tiny_model_dir))
    assert again.returncode == 2 and "already holds a run" in again.stderr
