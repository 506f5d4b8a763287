"""A finished run keeps only what ``--resume --max-steps`` needs: its last checkpoint, without the
optimizer moments and, when ``model/`` holds them, without the weights; resuming it trains the
extra steps from those weights with fresh moments. ``keep_finished_checkpoints`` keeps them as written;
interrupted runs keep whole checkpoints (their bitwise resume is tested in test_resume.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, TrainingInterrupted
from agentrl.plugins import load_plugins
from agentrl.rundir import checkpoints as ckpt
from agentrl.rundir import state_files as statefiles
from agentrl.rundir.checkpoints import complete_checkpoints
from agentrl.rundir.directory import resume_config
from agentrl.rundir.saved import read_checkpoint, weights_folder
from agentrl.training.rng import rng_states
from agentrl.training.trainer import Trainer


def _config(model_dir: Path, out: Path, **overrides) -> TrainConfig:
    """A tiny run rewarded by its replies' length (a random model's math rewards are all 0: no update)."""
    reward = out.parent / "length_reward.py"
    reward.write_text(
        "def reply_length(completions, **kwargs):\n    return [len(c[-1]['content']) / 100 for c in completions]\n"
    )
    base = dict(
        model=str(model_dir),
        max_steps=3,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(out),
        checkpoint_every=1,
        keep_checkpoints=2,
        learning_rate=1e-3,
        rewards={f"{reward}:reply_length": 1.0},
    )
    return TrainConfig(**{**base, **overrides})


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for file in sorted(folder.glob("*.safetensors")) for k, v in load_file(file).items()}


def _moments(folder: Path) -> dict[str, object]:
    return read_checkpoint(folder).optimizers


def test_a_finished_run_keeps_its_last_checkpoint_slim_and_resumes_with_more_steps(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    Trainer(_config(tiny_model_dir, out), load_plugins()).train()
    [last] = complete_checkpoints(out)  # step-1 and step-2 are gone
    assert last.name == "step-000003"
    assert _moments(last) == {"policy": None}  # the schedule stays, the AdamW moments go
    assert not (last / "model").exists()  # model/ holds the same weights
    assert ckpt.read_manifest(last)["weights_in"]["folder"] == "model" and ckpt.damage(out, last) is None
    assert sum(p.stat().st_size for p in last.rglob("*") if p.is_file()) < 0.2 * sum(
        p.stat().st_size for p in (out / "model").glob("*.safetensors")
    )

    config, folder = resume_config(out, max_steps=5)
    trainer = Trainer(config, load_plugins(), resume=folder)
    assert "the AdamW moments restart from zero" in capsys.readouterr().out
    finished = _weights(out / "model")
    assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in finished.items())  # continues from model/
    assert (
        not trainer.run.trained["policy"].optimizer.state and trainer.run.trained["policy"].scheduler.last_epoch == 3
    )  # fresh moments, schedule at step 3
    trainer.train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    assert not all(torch.equal(finished[k], v) for k, v in _weights(out / "model").items())  # it trained
    assert [p.name for p in complete_checkpoints(out)] == ["step-000005"]
    assert _moments(complete_checkpoints(out)[0]) == {"policy": None}


def test_keep_finished_checkpoints_leaves_them_whole_and_resume_restores_the_moments(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    Trainer(_config(tiny_model_dir, out, keep_finished_checkpoints=True), load_plugins()).train()
    assert [p.name for p in complete_checkpoints(out)] == ["step-000002", "step-000003"]  # keep_checkpoints=2
    last = complete_checkpoints(out)[-1]
    assert (last / "model").is_dir() and _moments(last)["policy"]["state"]
    config, folder = resume_config(out, max_steps=4)
    trainer = Trainer(config, load_plugins(), resume=folder)
    assert "restart" not in capsys.readouterr().out
    saved = _moments(last)["policy"]["state"]
    assert all(
        torch.equal(trainer.run.trained["policy"].optimizer.state_dict()["state"][i]["exp_avg"], saved[i]["exp_avg"])
        for i in saved
    )


def test_an_interrupted_run_keeps_its_checkpoint_whole(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    trainer = Trainer(_config(tiny_model_dir, out, max_steps=4), load_plugins())
    real_step = trainer.train_step

    def stop_after_two(step, *args):
        if step == 3:  # Ctrl-C as the third step starts (a KeyboardInterrupt raised by code is a failure)
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(step, *args)

    monkeypatch.setattr(trainer, "train_step", stop_after_two)
    with pytest.raises(TrainingInterrupted):
        trainer.train()
    assert [p.name for p in complete_checkpoints(out)] == ["step-000001", "step-000002"]
    for folder in complete_checkpoints(out):
        assert (folder / "model").is_dir() and _moments(folder)["policy"]["state"]


def test_slimming_drops_only_weights_the_export_holds_byte_for_byte(tmp_path):
    run_dir = tmp_path / "run"
    tensor = {"w": torch.arange(4.0)}
    for step in (1, 2):

        def write(folder: Path, step: int = step) -> None:
            (folder / "model").mkdir()
            save_file(tensor, folder / "model" / "model.safetensors")
            statefiles.save_tensors({"policy": {"state": {0: {"exp_avg": torch.ones(4)}}}}, folder / ckpt.OPTIMIZERS)
            statefiles.save_tensors({}, folder / ckpt.MODULES)
            statefiles.save_json(
                {
                    "schedules": {"policy": {"last_epoch": step}},
                    "processes": [{"rng": rng_states(), "engine": {}}],
                    "algorithm": {},
                    "plugins": {},
                },
                folder / ckpt.EXTRA,
            )
            counts = ("task_cursor", "metrics_bytes", "completions_bytes", "nonfinite_skips", "skipped_in_a_row")
            state = {"step": step, **dict.fromkeys(counts, 0), "eval_before": {}, "config": {}}
            (folder / ckpt.STATE).write_text(json.dumps(state))

        ckpt.write_atomically(run_dir, step, write, keep=2)
    (run_dir / "last").mkdir()
    save_file({"w": torch.arange(4.0) + 1}, run_dir / "last" / "model.safetensors")  # not the checkpoint's
    last = ckpt.checkpoint_dir(run_dir, 2)
    ckpt.slim_finished(run_dir, last, "last")
    assert complete_checkpoints(run_dir) == [last] and _moments(last) == {"policy": None}
    assert weights_folder(run_dir, last) == last / "model"  # kept: the export differs
    save_file(tensor, run_dir / "last" / "model.safetensors")
    ckpt.slim_finished(run_dir, last, "last")
    assert weights_folder(run_dir, last) == run_dir / "last" and not (last / "model").exists()
    assert read_checkpoint(last).schedules == {"policy": {"last_epoch": 2}} and ckpt.damage(run_dir, last) is None
    (run_dir / "last" / "model.safetensors").unlink()
    assert ckpt.damage(run_dir, last) == "last/model.safetensors (the run's export) is missing"
    (run_dir / "last").rmdir()
    with pytest.raises(ConfigError, match=r"holds no weights and the run's last/ folder .* is missing"):
        weights_folder(run_dir, last)
