"""The documented reward model kept trained on a replay buffer between iterations
(docs/guides/rewards.md, ``replay_rm.py``): it retrains after every EVERY-th step, its scores
change only then, and a resume across a retraining equals the uninterrupted run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentrl.config.train import TrainConfig
from agentrl.errors import TrainingInterrupted
from agentrl.plugins import load_plugins
from agentrl.rundir.directory import resume_config
from agentrl.testing import lockstep_plugins
from agentrl.training.trainer import Trainer

DOC = Path(__file__).resolve().parents[2] / "docs" / "guides" / "rewards.md"
STOP = """
import os, signal
from agentrl import hookimpl

@hookimpl
def agentrl_on_step_end(step, metrics):
    if step == int(os.environ.get("AGENTRL_TEST_STOP_AT", "0")):
        os.kill(os.getpid(), signal.SIGINT)
"""


def _plugin(folder: Path) -> tuple[str, str]:
    """The doc's replay_rm.py and a stop plugin, written into ``folder`` (a module of their own)."""
    code = re.search(r"```python\n# file: replay_rm\.py\n(.*?)```", DOC.read_text(), re.S)
    assert code, "docs/guides/rewards.md lost its replay_rm.py block"
    folder.mkdir()
    (folder / "replay_rm.py").write_text(code.group(1))
    (folder / "stop.py").write_text(STOP)
    return str(folder / "replay_rm.py"), str(folder / "stop.py")


def _train(model_dir: Path, folder: Path, out: Path, resume: Path | None = None, config: TrainConfig | None = None):
    plugin, stop = _plugin(folder)
    config = config or TrainConfig(
        model=str(model_dir),
        env="math",
        max_steps=5,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(out),
        checkpoint_every=1,
        rewards={f"{plugin}:learned": 1.0, "accuracy": 1.0},
        algorithm={"beta": 0.04, "ref_sync_every": 2},
        plugins=lockstep_plugins(),
    )
    if resume is not None:  # the saved config names the first run's file: this run's copy instead
        rewards = {f"{plugin}:learned": 1.0, "accuracy": 1.0}
        config = TrainConfig(**{**config.to_dict(), "rewards": rewards})
    return Trainer(config, load_plugins(modules=[plugin, stop]), resume=resume).train()


def _rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")} for line in lines]


def test_the_reward_model_retrains_between_iterations_and_resumes(tiny_model_dir, tmp_path, monkeypatch):
    straight = _rows(_train(tiny_model_dir, tmp_path / "a", tmp_path / "straight").run_dir)
    assert [row["replay_rm/buffer"] for row in straight] == [6.0, 12.0, 18.0, 24.0, 30.0]
    assert ["replay_rm/loss" in row for row in straight] == [False, True, False, True, False]
    learned = [row["reward/learned_mean"] for row in straight]
    assert learned[0] == learned[1] == 0.5  # untrained: sigmoid(0)
    assert learned[2] != 0.5 and learned[4] != learned[2]  # retrained after steps 2 and 4

    monkeypatch.setenv("AGENTRL_TEST_STOP_AT", "3")
    with pytest.raises(TrainingInterrupted):
        _train(tiny_model_dir, tmp_path / "b", tmp_path / "split")
    monkeypatch.delenv("AGENTRL_TEST_STOP_AT")
    config, checkpoint = resume_config(tmp_path / "split")
    result = _train(tiny_model_dir, tmp_path / "c", tmp_path / "split", resume=checkpoint, config=config)
    assert _rows(result.run_dir) == straight
