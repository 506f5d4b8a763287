"""``agentrl eval RUN_DIR`` evaluates a run as it evaluated itself: the run's env, env_args,
rewards, engine, engine_args (dtype included), precision and seed from its config.yaml, with
``--set`` and the flags above them; its figures equal the run's own ``eval.json``. A run's
config.yaml names a file env by its absolute path, so ``agentrl eval RUN_DIR`` works from any
directory; a run without an exported model is refused with what to do instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_in_process import TINY, agentrl_in_process, assert_one_line, cli
from faulty_plugin import run_config
from typer.testing import CliRunner

import agentrl.training.evaluate
from agentrl.cli.app import app
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.training.trainer import Trainer

# A reward that depends on every sampled character: equal figures mean equal generations.
LENGTH_REWARD = """
def reply_length(completions, **kwargs):
    return [len(c[-1]["content"]) / 100 for c in completions]
"""


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 1-step run whose config sets a non-default env_args, reward, engine dtype and
    batch size, precision and seed."""
    folder = tmp_path_factory.mktemp("eval-run")
    reward = folder / "length_reward.py"
    reward.write_text(LENGTH_REWARD)
    config = TrainConfig(
        model=str(tiny_model_dir),
        env="math",
        env_args={"seed": 4, "num_eval": 6},
        max_steps=1,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=8,
        eval_tasks=6,
        eval_sampled=False,
        keep_best=False,
        seed=3,
        precision="fp32",
        engine_args={"dtype": "bfloat16", "batch_size": 5},
        rewards={f"{reward}:reply_length": 0.5},
        output_dir=str(folder / "run"),
    )
    Trainer(config, load_plugins()).train()
    return folder / "run"


def _eval(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``agentrl eval ARGS --json`` in-process; returns its figures and what evaluate() was given."""
    seen: dict[str, Any] = {}
    real = agentrl.training.evaluate.evaluate

    def recording(rollout: Any, envs: list[Any], tasks: list[Any], **kwargs: Any) -> Any:
        seen.update(rollout=rollout, envs=envs, tasks=tasks, **kwargs)
        return real(rollout, envs, tasks, **kwargs)

    monkeypatch.setattr(agentrl.training.evaluate, "evaluate", recording)
    result = CliRunner().invoke(app, ["eval", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1]), seen


def test_eval_of_a_run_dir_uses_the_runs_settings_and_matches_its_eval_json(run_dir, monkeypatch):
    figures, seen = _eval(monkeypatch, str(run_dir), "--num-tasks", "6")
    engine = seen["rollout"].engine
    assert engine.options.dtype == "bfloat16" and engine.options.batch_size == 5 and engine.dtype == "bfloat16"
    assert (seen["envs"][0].seed, seen["envs"][0].num_eval) == (4, 6)
    assert {name: weight for name, (_, weight) in seen["reward_fns"].items()} == {"reply_length": 0.5}
    assert seen["seed"] == 3 and seen["max_new_tokens"] == 8 and seen["temperature"] == 0.0
    after = json.loads((run_dir / "eval.json").read_text())["after"]
    assert {k: figures[k] for k in after} == after  # accuracy, env return, the reward's mean, ...
    assert figures["engine_args"] == {"dtype": "bfloat16", "batch_size": 5} and figures["precision"] == "fp32"


def test_set_and_flags_override_the_runs_settings_and_model_still_works(run_dir, monkeypatch):
    # --set refines the run's engine_args key by key; a flag beats the run's value.
    _, seen = _eval(
        monkeypatch,
        "--model",
        str(run_dir),
        "--num-tasks",
        "2",
        "--set",
        "engine_args.dtype=float32",
        "--max-new-tokens",
        "4",
        "--temperature",
        "0.5",
    )
    engine = seen["rollout"].engine
    assert engine.options.batch_size == 5 and engine.dtype == "float32"
    assert seen["max_new_tokens"] == 4 and seen["temperature"] == 0.5
    figures, seen = _eval(
        monkeypatch,
        str(run_dir),
        "--num-tasks",
        "2",
        "--set",
        "precision=bf16",
        "--set",
        "engine_args={dtype: float32}",
    )
    assert seen["rollout"].engine.options.batch_size == 64 and figures["precision"] == "bf16"


def test_run_dir_and_a_different_model_are_refused(run_dir, tiny_model_dir):
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--model", str(tiny_model_dir)])
    assert result.exit_code == 2 and "give the model once" in result.output


SCORED_ENV = '''
from agentrl import Env


class Scored(Env):
    """Pays a share of the answer's digits; only the exact answer is a success (return 1.0)."""

    def __init__(self, target: int = 42, n: int = 6):
        super().__init__()
        self.target, self.n = target, n

    def train_tasks(self):
        return [{"question": f"Say {self.target + i}.", "answer": str(self.target + i)} for i in range(self.n)]

    def eval_tasks(self):
        return self.train_tasks()[:2]

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        answer = self.task["answer"]
        return [], sum(a == b for a, b in zip(answer, text)) / len(answer), True, {}
'''


def test_eval_of_a_run_dir_uses_the_runs_env_and_works_from_another_directory(tiny_model_dir, tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    (project / "scored.py").write_text(SCORED_ENV)
    trained = agentrl_in_process(
        "train",
        "--env",
        "scored.py:Scored",
        "--set",
        "env_args.target=70",
        "--model",
        str(tiny_model_dir),
        "--output-dir",
        "run",
        "--set",
        "eval_tasks=2",
        *TINY,
        cwd=project,
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr
    config = yaml.safe_load((project / "run" / "config.yaml").read_text())
    assert config["env"] == f"{project / 'scored.py'}:Scored"  # absolute: usable from anywhere
    result = agentrl_in_process(
        "eval", "--model", str(project / "run"), "--num-tasks", "2", "--max-new-tokens", "4", "--json", cwd=elsewhere
    )
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["env"] == config["env"] and metrics["env_args"] == {"target": 70}
    assert metrics["model"] == str(project / "run") and metrics["eval/num_tasks"] == 2
    assert f"on {config['env']}" in " ".join(result.stderr.split())


def test_eval_of_a_run_without_an_exported_model_says_what_to_do(tiny_model_dir, tmp_path, faults):
    config = run_config(tiny_model_dir, tmp_path, env=f"{faults}:Tasks", save_model=False, checkpoint_every=1)
    Trainer(config, load_plugins()).train()
    run = tmp_path / "run"
    assert not (run / "model").exists()
    assert_one_line(
        cli("eval", str(run), "--num-tasks", "1"),
        f"run dir {str(run)!r} has no exported model (no model/ folder): the run was trained with "
        f"save_model=false, or has not finished; use its newest checkpoint's weights, --model "
        f"{str(run / 'checkpoints' / 'step-000001' / 'model')!r} (a full HF folder), or train it again "
        "with save_model=true (the default)",
    )
