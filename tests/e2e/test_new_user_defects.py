"""What a new user hit following the README (issue 14), each fixed: eval of a run dir uses the run's
env, a portable config.yaml, headline accuracy of a scored-but-lost game, the active rewards shown,
did-you-mean for rewards, --help defaults, --plugin files, misspelt hooks, a clean log file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_in_process import agentrl_in_process

from agentrl import Env
from agentrl.testing import make_trajectory
from agentrl.training.evaluate import episode_success

AGENTRL = [sys.executable, "-m", "agentrl.cli.app"]
TINY = ["--max-steps", "1", "--num-generations", "2", "--prompts-per-step", "2", "--set", "max_new_tokens=4"]

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


def agentrl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``agentrl ARGS`` in a subprocess 200 columns wide: for what only a process shows (what its
    output streams get, --help laid out for the terminal); the other tests run the CLI in-process."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


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


def test_a_log_file_gets_whole_lines_with_the_phase_and_no_carriage_returns(tiny_model_dir, tmp_path):
    result = agentrl(
        "train",
        "--env",
        "math",
        "--model",
        str(tiny_model_dir),
        "--output-dir",
        str(tmp_path / "r"),
        "--set",
        "eval_tasks=2",
        "--reward",
        "format",
        *TINY,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\r" not in result.stdout + result.stderr
    assert "Loading weights" not in result.stdout + result.stderr  # transformers' own bars are off
    out = " ".join(result.stdout.split())
    assert "step 1/1" in out
    assert (
        "rewards: env return x1 + format x1 (--reward replaces the env's defaults; add --reward format:1 "
        "--reward accuracy:1 to keep them)"
    ) in out
    assert "within noise" in out or "noise" in out  # 2 held-out tasks: the before/after figure is noise


class ScoredGame(Env):
    """A game whose return scores a lost game in (0, 1) and sets no success flag."""

    def train_tasks(self):
        return [{"question": "play"}]

    def eval_tasks(self):
        return self.train_tasks()

    def start(self, task):
        return [{"role": "user", "content": "play"}]

    def respond(self, text):
        return [], 0.4, True, {}


def episode(env_return: float, **info: object):
    trajectory = make_trajectory(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], {}, info=dict(info)
    )
    trajectory.turns[0].reward = env_return
    return trajectory


def test_a_scored_but_lost_game_is_not_a_success() -> None:
    lost, won = episode(0.4), episode(1.0)
    assert lost.env_return == pytest.approx(0.4) and won.env_return == pytest.approx(1.0)
    assert not episode_success(lost, ScoredGame.success_threshold)  # return > 0 used to count as solved
    assert episode_success(won, ScoredGame.success_threshold)
    assert episode_success(lost, success_threshold=0.3)  # an env may lower its bar
    assert episode_success(episode(0.4, success=True))  # info["success"] wins over the return
    assert not episode_success(episode(1.0, correct=False))


def test_print_config_shows_the_rewards_that_will_run(tmp_path):
    default = yaml.safe_load(agentrl_in_process("train", "--print-config").stdout)
    assert default["rewards"] == {"format": 1.0, "accuracy": 1.0} and default["algorithm"]["epsilon_low"] == 0.2
    chosen = yaml.safe_load(agentrl_in_process("train", "--reward", "accuracy:0.5", "--print-config").stdout)
    assert chosen["rewards"] == {"accuracy": 0.5}


def test_unknown_reward_gets_did_you_mean(tmp_path):
    result = agentrl_in_process(
        "train", "--reward", "acuracy", "--output-dir", str(tmp_path / "r"), "--set", "eval_tasks=0"
    )
    assert result.returncode == 2
    assert "unknown reward 'acuracy'; did you mean 'accuracy'?" in result.stderr
    assert not (tmp_path / "r").exists()


def test_train_help_shows_the_defaults():
    text = " ".join(agentrl("train", "--help").stdout.split())
    for default in (
        "[default: math]",
        "[default: grpo]",
        "[default: smollm2-135m]",
        "[default: 40]",
        "[default: the env's]",
    ):
        assert default in text, default


PLUGIN_FILE = '''
from agentrl import hookimpl


def shout(trajectories):
    """1.0 for a reply with an exclamation mark."""
    return [float("!" in t.completion_text) for t in trajectories]


@hookimpl
def agentrl_register_rewards(register):
    register("shout", shout)
'''


def test_plugin_from_a_file_relative_to_the_cwd_and_disabling_a_plugin(tmp_path):
    (tmp_path / "myplug.py").write_text(PLUGIN_FILE)
    listed = agentrl_in_process(
        "plugins", "--plugin", "myplug.py", "--disable-plugin", "gem_env", "--json", cwd=tmp_path
    )
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["myplug.py"]["registers"] == {"reward": ["shout"]} and "gem_env" not in rows
    shown = agentrl_in_process(
        "train", "--plugin", "myplug.py", "--reward", "shout:0.3", "--print-config", cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    missing = agentrl_in_process(
        "train",
        "--disable-plugin",
        "rewards",
        "--reward",
        "format",
        "--output-dir",
        str(tmp_path / "r"),
        "--set",
        "eval_tasks=0",
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and "unknown reward 'format'" in missing.stderr


def test_a_misspelt_hook_is_named_with_the_fix(tmp_path):
    (tmp_path / "typo.py").write_text(
        PLUGIN_FILE.replace("def agentrl_register_rewards", "def agentrl_register_reward")
    )
    result = agentrl_in_process("plugins", "--plugin", "typo.py", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        "implements 'agentrl_register_reward', which is not an agentrl hook; rename it to 'agentrl_register_rewards'"
    ) in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


DATACLASS_ENV = """
from __future__ import annotations

from dataclasses import dataclass

from agentrl import Env


@dataclass
class Question:
    text: str


class Asks(Env):
    def train_tasks(self):
        return [{"question": "Say 1.", "answer": "1"}]

    def eval_tasks(self):
        return [{"question": "Say 2.", "answer": "2"}]

    def start(self, task):
        return [{"role": "user", "content": Question(task["question"]).text}]

    def respond(self, text):
        return [], float(self.task["answer"] in text), True, {}

    def gold_reply(self, task):
        return task["answer"]
"""


def test_an_env_file_may_define_dataclasses(tmp_path):
    from agentrl.env import load_env_class
    from agentrl.testing import check_env

    (tmp_path / "asks.py").write_text(DATACLASS_ENV)
    check_env(load_env_class(f"{tmp_path / 'asks.py'}:Asks"))


def test_a_hook_with_a_wrong_signature_is_named(tmp_path):
    (tmp_path / "wrong.py").write_text(
        PLUGIN_FILE.replace(
            "def agentrl_register_rewards(register)", "def agentrl_register_rewards(register, registry)"
        )
    )
    result = agentrl_in_process("plugins", "--plugin", "wrong.py", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "plugin 'wrong.py' has an invalid hook implementation" in message and "registry" in message
