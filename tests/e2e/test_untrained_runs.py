"""A run that cannot train says so: ``agentrl train`` whose episodes all go unscored (an agent that
raises, hangs past its ``timeout_s`` or returns NaN; an env or reward functions that give no finite
reward) ends with exit status 2 and one line naming the cause and the first failure; ``max_nonfinite_steps``
steps in a row that trained nothing stop a run mid-way; a run some of whose steps trained ends normally,
reporting the scored and unscored episodes; an evaluation that scored nothing reads ``0 of N scored``
(docs/concepts/guards.md#runs-that-train-nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_in_process import agentrl_in_process

RAISES = "def solve(task, client):\n    raise KeyError('x')\n"
HANGS = "import time\n\n\ndef solve(task, client):\n    time.sleep(2)\n    return 1.0\n"


def _train(model: Path, out: Path, *extra: str, steps: int = 2):
    """``agentrl train`` of the tiny model on math: ``steps`` steps of 2 tasks x 2 episodes, 4 tokens each."""
    return agentrl_in_process(
        "train",
        "--env",
        "math",
        "--model",
        str(model),
        "--output-dir",
        str(out),
        "--max-steps",
        str(steps),
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--set",
        "max_new_tokens=4",
        *extra,
    )


def _agent(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "agent.py"
    path.write_text("import openai\n\n\n" + body)
    return ["--set", "rollout=openai_agent", "--set", f"plugins.openai_agent.agent={path}:solve"]


def _error_line(result) -> str:
    """The one error line of a run that failed with exit status 2: the last on stderr, no traceback."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[-1]


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "body, extra, cause, first",
    [
        (RAISES, [], "8 raised", "agent.py:solve raised on sample 0"),
        (HANGS, ["--set", "plugins.openai_agent.timeout_s=0.2"], "8 timed out", "agent.py:solve timed out on sample 0"),
    ],
    ids=["raises", "hangs"],
)
def test_an_agent_that_never_scores_ends_the_run_non_zero_naming_why(
    tiny_model_dir, tmp_path, body, extra, cause, first
):
    out = tmp_path / "run"
    with pytest.warns(RuntimeWarning, match="no episode of the batch has a finite reward"):
        result = _train(tiny_model_dir, out, *_agent(tmp_path, body), *extra, "--set", "eval_tasks=2")
    line = _error_line(result)
    assert f"the run trained nothing: 2 of 2 steps had no scored episode (8 episodes: {cause}; first: " in line
    assert first in line and "no model/ was saved (it would be untrained)" in line and str(out) in line
    if body is RAISES:
        assert "KeyError: 'x'" in line
        assert "eval before: 0 of 2 scored (2 raised), no accuracy" in result.stdout
    rows = _rows(out)  # what the run wrote stays: its steps' metrics and the last checkpoint
    assert [(r["step"], r["train/episodes_scored"], r["train/episodes_unscored"]) for r in rows] == [
        (1, 0.0, 4.0),
        (2, 0.0, 4.0),
    ]
    assert not (out / "model").exists() and not (out / "eval.json").exists()
    assert (out / "checkpoints" / "step-000002").is_dir()


NAN_ENV = """
import math
from agentrl import Env


class NanReward(Env):
    def train_tasks(self):
        return [{"id": i, "question": "Say 1.", "answer": "1"} for i in range(4)]

    def eval_tasks(self):
        return self.train_tasks()

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        return [], math.nan, True, {}
"""


def test_a_multi_turn_env_whose_reward_is_nan_fails_in_one_line(tiny_model_dir, tmp_path):
    (tmp_path / "nan_env.py").write_text(NAN_ENV)
    out = tmp_path / "run"
    result = _train(tiny_model_dir, out, "--env", f"{tmp_path / 'nan_env.py'}:NanReward", "--set", "eval_tasks=0")
    line = _error_line(result)
    assert "NanReward.respond must return a finite number as its reward (2nd value); got a float nan" in line


def _reward(tmp_path: Path, body: str, eval_tasks: int = 0) -> list[str]:
    """A reward function file (``scores(trajectories)``, ``CALLS``: one item per call so far) as the
    only reward, the env's return weighted 0."""
    path = tmp_path / "scores.py"
    path.write_text("CALLS = []\n\n\ndef scores(trajectories):\n    CALLS.append(1)\n" + body)
    return ["--reward", f"{path}:scores", "--set", "env_reward_weight=0", "--set", f"eval_tasks={eval_tasks}"]


def test_reward_functions_that_score_nothing_end_the_run_non_zero(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.warns(RuntimeWarning, match="the update was skipped"):
        result = _train(tiny_model_dir, out, *_reward(tmp_path, "    return [None] * len(trajectories)\n"))
    line = _error_line(result)
    assert (
        "the run trained nothing: 2 of 2 steps had no scored episode (8 episodes: 8 got no finite reward from "
        "any reward function; first: no reward function gave sample 0 (task "
    ) in line


def test_steps_in_a_row_that_train_nothing_stop_the_run_mid_way(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    body = "    return [1.0 if len(CALLS) == 1 else float('nan') for _ in trajectories]\n"
    with pytest.warns(RuntimeWarning, match="the update was skipped"):
        result = _train(tiny_model_dir, out, *_reward(tmp_path, body), "--set", "max_nonfinite_steps=2", steps=6)
    line = _error_line(result)
    assert "steps 2-3: 2 steps in a row trained nothing (max_nonfinite_steps=2): 2 had no scored episode" in line
    assert "8 episodes: 8 got no finite reward from any reward function (scores non-finite on 8)" in line
    assert "The weights are those after step 1" in line
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]


def test_a_run_some_of_whose_steps_trained_ends_normally_counting_the_unscored(tiny_model_dir, tmp_path):
    # Calls: the evaluation before, steps 1-3, the evaluation after; every other one scores nothing.
    out = tmp_path / "run"
    body = "    return [None if len(CALLS) % 2 else 1.0 for _ in trajectories]\n"
    with pytest.warns(RuntimeWarning, match="step 2: no episode of the batch has a finite reward"):
        result = _train(tiny_model_dir, out, *_reward(tmp_path, body, eval_tasks=2), steps=3)
    assert result.returncode == 0, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    nothing = "got no finite reward from any reward function"
    assert f"eval before: 0 of 2 scored (2 {nothing}), no accuracy" in text
    assert f"held-out accuracy: 0 of 2 scored (2 {nothing}) -> 0 of 2 scored (2 {nothing})" in text
    assert f"episodes: 8 scored, 4 unscored (4 {nothing}) over 3 steps" in text
    rows = [r for r in _rows(out) if "train/episodes_unscored" in r]
    assert [r["train/episodes_unscored"] for r in rows] == [0.0, 4.0, 0.0]
    assert (out / "model").is_dir()  # steps 1 and 3 trained


def test_eval_that_scored_no_episode_says_0_of_n_scored(tiny_model_dir, tmp_path):
    result = agentrl_in_process(
        "eval",
        str(tiny_model_dir),
        "--env",
        "math",
        "--num-tasks",
        "3",
        "--max-new-tokens",
        "4",
        *_agent(tmp_path, RAISES),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "eval/accuracy: 0 of 3 scored (3 raised)" in result.stdout
    assert "eval/episodes_unscored: 3.0000" in result.stdout


def test_eval_with_some_unscored_episodes_counts_them(tiny_model_dir, tmp_path):
    path = tmp_path / "half.py"
    path.write_text("def half(trajectories):\n    return [None if i % 2 else 1.0 for i in range(len(trajectories))]\n")
    result = agentrl_in_process(
        "eval",
        str(tiny_model_dir),
        "--env",
        "math",
        "--num-tasks",
        "4",
        "--max-new-tokens",
        "4",
        "--set",
        "env_reward_weight=0",
        "--set",
        f'rewards={{"{path}:half": 1.0}}',
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(2 of 4 unscored, counted unsolved: 2 got no finite reward from any reward function)" in result.stdout
