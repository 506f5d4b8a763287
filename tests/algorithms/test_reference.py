"""Iterative GRPO's reference reset (``algorithm.ref_sync_every``, ``ref_sync_mix``): after every
M-th step the reference equals the policy (or the mix, checked against float64 here), a resume
across a reset equals the uninterrupted run bit for bit, and what cannot work is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl import hookimpl
from agentrl.algorithms.reference import REFERENCE_FILE, load_reference, mix_into
from agentrl.config.train import TrainConfig
from agentrl.errors import CheckpointError, ConfigError, TrainingInterrupted
from agentrl.plugins import load_plugins
from agentrl.rundir.directory import resume_config
from agentrl.testing import build_tiny_model, lockstep_plugins
from agentrl.training.trainer import Trainer

STOP_PLUGIN = """
import os, signal
from agentrl import hookimpl

@hookimpl
def agentrl_on_step_end(step, metrics):
    if step == int(os.environ.get("AGENTRL_TEST_STOP_AT", "0")):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the step's records: the step completes
"""


def _config(model_dir: Path, out: Path, **algorithm) -> TrainConfig:
    return TrainConfig(
        model=str(model_dir),
        max_steps=4,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(out),
        checkpoint_every=1,
        keep_checkpoints=5,
        learning_rate=1e-2,
        rewards={"agentrl.testing:parity_reward": 1.0},
        algorithm={"beta": 0.5, **algorithm},
        plugins=lockstep_plugins(),
    )


def _manager(folder: Path):
    folder.mkdir()
    (folder / "stop_plugin.py").write_text(STOP_PLUGIN)
    return load_plugins(modules=[str(folder / "stop_plugin.py")])


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters()}


def test_mix_into_is_the_float64_mix_rounded_once():
    ref, policy = build_tiny_model(64, seed=0), build_tiny_model(64, seed=1)
    before, theirs = _params(ref), _params(policy)
    mix_into(ref, policy, 0.3)
    for name, value in _params(ref).items():
        expected = (0.3 * before[name].to(torch.float64) + 0.7 * theirs[name].to(torch.float64)).float()
        assert torch.equal(value, expected), name
        if not torch.equal(before[name], theirs[name]):  # (layer norms start at 1 in both)
            assert not torch.equal(value, theirs[name]) and not torch.equal(value, before[name])
    mix_into(ref, policy, 0.0)
    assert all(torch.equal(v, theirs[k]) for k, v in _params(ref).items())


class Snapshots:
    """A step-end hook keeping the policy's and the reference's parameters after every step."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.policy: list[dict[str, torch.Tensor]] = []
        self.reference: list[dict[str, torch.Tensor]] = []

    @hookimpl
    def agentrl_on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        self.policy.append(_params(self.trainer.run.model))
        self.reference.append(_params(self.trainer.run.ref_model))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_after_every_mth_step_the_reference_is_the_policy(tiny_model_dir, tmp_path):
    manager, snapshots = _manager(tmp_path / "p"), Snapshots()
    manager.register_plugin(snapshots, name="snapshots")
    trainer = snapshots.trainer = Trainer(_config(tiny_model_dir, tmp_path / "run", ref_sync_every=2), manager)
    base = _params(trainer.run.ref_model)
    result = trainer.train()
    policy, ref = snapshots.policy, snapshots.reference
    assert _same(ref[0], base)  # step 1: no reset yet
    assert _same(ref[1], policy[1]) and _same(ref[2], policy[1])  # reset after step 2, kept through step 3
    assert _same(ref[3], policy[3]) and not _same(policy[3], policy[1])  # reset after step 4
    assert not _same(policy[1], base)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row.get("train/reference_reset", 0.0) for row in rows] == [0.0, 1.0, 0.0, 1.0]
    kl = [row["kl"] for row in rows]  # steps 1 and 3 sample from the reference itself
    assert kl[0] == 0.0 and kl[2] == 0.0 and kl[1] > 0 and kl[3] > 0


def test_a_mixed_reset_is_the_float64_mix_of_reference_and_policy(tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path / "run", ref_sync_every=2, ref_sync_mix=0.25)
    trainer = Trainer(TrainConfig(**{**config.to_dict(), "max_steps": 2}), _manager(tmp_path / "p"))
    base = _params(trainer.run.ref_model)
    trainer.train()
    policy, ref = _params(trainer.run.model), _params(trainer.run.ref_model)
    for name, value in ref.items():
        expected = (0.25 * base[name].double() + 0.75 * policy[name].double()).float()
        assert torch.equal(value, expected), name


def test_resume_across_a_reset_equals_the_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch):
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(_config(tiny_model_dir, straight, ref_sync_every=2), _manager(tmp_path / "a")).train()
    monkeypatch.setenv("AGENTRL_TEST_STOP_AT", "3")
    with pytest.raises(TrainingInterrupted):
        Trainer(_config(tiny_model_dir, split, ref_sync_every=2), _manager(tmp_path / "b")).train()
    monkeypatch.delenv("AGENTRL_TEST_STOP_AT")
    config, checkpoint = resume_config(split)
    assert checkpoint.name == "step-000003" and (checkpoint / REFERENCE_FILE).is_file()
    Trainer(config, _manager(tmp_path / "c"), resume=checkpoint).train()

    def rows(run_dir: Path) -> list[dict]:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")} for line in lines]

    assert rows(split) == rows(straight)
    a, b = _weights(straight / "model"), _weights(split / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_after_a_reset_without_the_reference_is_refused(tmp_path):
    model = build_tiny_model(64)
    load_reference(model, tmp_path, needed=False)  # before the first reset: the base model is the reference
    with pytest.raises(CheckpointError, match=r"holds no reference\.pt although the reference was reset"):
        load_reference(model, tmp_path, needed=True)


@pytest.mark.parametrize(
    ("algorithm", "extra", "match"),
    [
        ({"ref_sync_every": 2, "beta": 0.0}, {}, r"algorithm\.ref_sync_every=2 is invalid: .*beta > 0"),
        ({"ref_sync_every": -1}, {}, r"algorithm\.ref_sync_every=-1"),
        ({"ref_sync_every": 2, "ref_sync_mix": 1.0}, {}, r"algorithm\.ref_sync_mix=1\.0"),
        ({"ref_sync_every": 2}, {"lora": {"r": 4}}, r"ref_sync_every=2 with lora"),
    ],
)
def test_what_a_reset_cannot_do_is_refused(tiny_model_dir, tmp_path, algorithm, extra, match):
    config = _config(tiny_model_dir, tmp_path / "run")
    with pytest.raises(ConfigError, match=match):
        values = {**config.to_dict(), **extra, "algorithm": {"beta": 0.5, **algorithm}}
        Trainer(TrainConfig(**values), _manager(tmp_path / "p"))
