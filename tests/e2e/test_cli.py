"""The ``agentrl`` command end to end: runs, evaluation and start-up warnings in a real subprocess
through the installed entry point; what is refused or printed before a run starts through the
in-process runner (:mod:`cli_in_process`: the same command, without ~5 s of imports a process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_in_process import CliResult, agentrl_in_process

AGENTRL = [sys.executable, "-m", "agentrl.cli.app"]


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"agentrl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def in_process(*args: str, check: bool = True) -> CliResult:
    """:func:`run`, through the in-process runner: for what the command decides before a run starts."""
    result = agentrl_in_process(*args)
    if check and result.returncode != 0:
        raise AssertionError(f"agentrl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def test_train_two_steps_on_tiny_model_writes_the_run(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run(
        "train",
        "--env",
        "math",
        "--algo",
        "grpo",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "eval_tasks=4",
        "--set",
        "max_new_tokens=8",
        "--set",
        "algorithm.beta=0.1",
    )
    assert "held-out accuracy:" in result.stdout and f"run saved to {out}" in result.stdout
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 2]
    assert "kl" in lines[0] and lines[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    assert (out / "model" / "config.json").is_file() and (out / "training.png").is_file()
    assert "FutureWarning" not in result.stderr, result.stderr  # nothing a user cannot act on
    recorded = json.loads((out / "eval.json").read_text())
    assert set(recorded) == {"before", "after", "best"}  # keep_best: which evaluated policy model/ holds
    assert recorded["best"]["step"] in (0, 2) and recorded["best"]["metric"] == "eval/reward_mean"
    assert "eval/accuracy_sampled" not in recorded["after"]  # one (greedy) evaluation unless eval_sampled
    evaluated = run("eval", "--model", str(out), "--num-tasks", "4", "--max-new-tokens", "8", "--json")
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["eval/num_tasks"] == 4


def test_plugins_lists_builtins_with_what_they_register():
    rows = json.loads(in_process("plugins", "--json").stdout)
    registered = {row["name"]: row["registers"] for row in rows}
    assert registered["grpo"] == {"algorithm": ["grpo"]}
    assert registered["ppo"] == {"algorithm": ["ppo"]}
    assert "math" in registered["math_env"]["env"]
    assert registered["hf_engine"] == {"engine": ["hf"]}


def test_print_config_shows_resolved_values(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("learning_rate: 3.0e-6\nalgorithm:\n  loss_type: grpo\n")
    result = in_process(
        "train", "--config", str(config), "--max-steps", "7", "--set", "algorithm.beta=0.02", "--print-config"
    )
    assert "max_steps: 7" in result.stdout and "learning_rate: 3.0e-06" in result.stdout
    assert "loss_type: grpo" in result.stdout and "beta: 0.02" in result.stdout
    result = in_process("train", "--algo", "gspo", "--set", "plugins.sampler_correction.mode=tis", "--print-config")
    assert "importance_sampling_level: sequence" in result.stdout and "epsilon_high: 0.0004" in result.stdout
    assert "sampler_correction:\n    mode: tis\n    level: token\n    cap: 2.0" in result.stdout
    assert "engine_args:\n  dtype: auto\n  batch_size: 64" in result.stdout  # the engine's options


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "maths"], "unknown env 'maths'; did you mean 'math'?"),
        (["--algo", "grpo", "--set", "algorithm.loss_type=mean"], "algorithm.loss_type='mean' is invalid"),
        (["--set", "max_stpes=3"], "unknown config key 'max_stpes'; did you mean 'max_steps'?"),
        (["--model", "/nonexistent/model"], "model '/nonexistent/model' not found"),
        (["--reward", "format:heavy"], "weight 'heavy' is not a number"),
        (["--set", "plugins.sampler_correction.mode=clip"], "plugins.sampler_correction.mode='clip' is invalid"),
        (
            ["--set", "plugins.nope.x=1"],
            "unknown plugin settings section plugins.nope; sections: judge, multi_turn, "
            "openai_agent, process_reward_model, reward_model, sampler_correction, trackers",
        ),
    ],
)
def test_bad_input_is_one_clear_line(args, message, tmp_path):
    result = in_process("train", "--output-dir", str(tmp_path / "r"), "--set", "eval_tasks=0", *args, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "args", [["--env", "maths"], ["--reward", "tiny_rm"], ["--set", "plugins.sampler_correction.mode=clip"]]
)
def test_a_bad_name_fails_before_the_run_starts(args, tmp_path):
    """Checked against what is installed before the run's banner, the trainer's imports or a model."""
    result = in_process("train", "--output-dir", str(tmp_path / "r"), *args, check=False)
    assert result.returncode == 2 and "error:" in result.stderr, result.stdout + result.stderr
    assert "agentrl grpo on" not in result.stdout, result.stdout  # the banner _fit prints once the names hold
    assert not (tmp_path / "r" / "config.yaml").exists()


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("tiny_rm", "error: unknown reward 'tiny_rm'; Installed: "),
        ("no_such_file.py:score", "no_such_file.py' does not exist"),
    ],
)
def test_print_config_refuses_a_reward_as_train_does(reward, message, tiny_model_dir, tmp_path):
    printed = in_process("train", "--reward", reward, "--print-config", check=False)
    trained = in_process(
        "train",
        "--reward",
        reward,
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--set",
        "eval_tasks=0",
        "--output-dir",
        str(tmp_path / "r"),
        check=False,
    )
    for result in (printed, trained):
        assert result.returncode == 2 and message in result.stderr, result.stdout + result.stderr
    assert printed.stderr.splitlines()[-1] == trained.stderr.splitlines()[-1]  # the same one line
    assert "rewards:" not in printed.stdout


# What the hf engine's decode does on transformers >= 5.24 (``past_key_values`` renamed ``cache``),
# through transformers' own deprecation machinery.
OLD_CACHE_NAME = """
from transformers.utils.deprecation import deprecate_kwarg


@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
def forward(cache=None):
    return cache


forward(past_key_values=None)
"""


def test_library_warnings_no_user_can_act_on_are_hidden(tmp_path):
    plugin = tmp_path / "old_cache_name.py"
    plugin.write_text(OLD_CACHE_NAME)
    bare = subprocess.run([sys.executable, str(plugin)], capture_output=True, text=True, timeout=300)
    assert "FutureWarning: `past_key_values` is deprecated" in bare.stderr  # what a run printed
    result = run("plugins", "--plugin", str(plugin), "--json")  # the same call, inside the CLI
    assert any(row["name"].endswith("old_cache_name.py") for row in json.loads(result.stdout))  # it ran
    assert "Warning" not in result.stderr, result.stderr


@pytest.mark.slow
def test_train_on_the_real_default_model(tmp_path):
    """The README's main command on the embedded SmolLM2, shrunk to two small steps."""
    out = tmp_path / "run"
    result = run(
        "train",
        "--env",
        "math",
        "--algo",
        "grpo",
        "--max-steps",
        "2",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "4",
        "--output-dir",
        str(out),
        "--set",
        "eval_tasks=8",
        "--set",
        "max_new_tokens=24",
    )
    assert "held-out accuracy:" in result.stdout
    banner = " ".join(result.stdout.split())  # the console wraps long lines
    # what samples: auto's choices, bf16 where the run is bf16, else fp32 on the bf16-rounded weights
    assert (
        "sampler: hf engine, bf16, a copy of the weights (engine_args.dtype: auto -> bfloat16)" in banner
        or "sampler: hf engine, fp32, a copy of the weights rounded to bf16 (engine_args.dtype: auto -> "
        "bfloat16_weights)"
        in banner
    ), result.stdout
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= line["reward/total_mean"] <= 1.2 for line in lines[:2])
    # At step 1 the bf16 sampler and the trainer agree to within bf16 noise (docs/concepts/guards.md#logprob-parity).
    assert lines[0]["policy/sampler_logprob_gap"] < 0.1
    before, after = (json.loads((out / "eval.json").read_text())[k]["eval/accuracy"] for k in ("before", "after"))
    assert 0.0 < before <= 1.0 and 0.0 <= after <= 1.0


CUSTOM_ENV = '''
from agentrl import Env


class Countdown(Env):
    """Say the number that comes before the one in the prompt."""

    max_turns = 1

    def train_tasks(self):
        return [{"question": f"What comes before {n}?", "answer": str(n - 1)} for n in range(10, 500)]

    def eval_tasks(self):
        return [{"question": f"What comes before {n}?", "answer": str(n - 1)} for n in range(2, 10)]

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        correct = self.task["answer"] in text
        return [], float(correct), True, {"correct": correct}
'''


def test_custom_env_from_a_file(tiny_model_dir, tmp_path):
    """The README's custom-env example runs by ``path.py:Class`` and passes the contract checks."""
    path = tmp_path / "countdown.py"
    path.write_text(CUSTOM_ENV)
    from agentrl.env import load_env_class
    from agentrl.testing import check_env

    check_env(load_env_class(f"{path}:Countdown"))
    out = tmp_path / "run"
    result = run(
        "train",
        "--env",
        f"{path}:Countdown",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--set",
        "eval_tasks=2",
        "--set",
        "max_new_tokens=4",
    )
    assert "held-out accuracy:" in result.stdout
    bad = run("train", "--env", f"{path}:Nope", "--output-dir", str(tmp_path / "other"), check=False)
    assert bad.returncode == 2 and "has no 'Nope'; it defines: Countdown, Env" in " ".join(bad.stderr.split())
