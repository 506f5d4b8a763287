"""``agentrl train`` (agentrl.cli.train) end to end: what it prints (whole lines with the phase and no
carriage returns in a log file, the rewards that will run, --help with the defaults, --print-config)
and the values it refuses in one line before a run starts: an unknown reward name or a non-finite
weight, --num-processes below 1, a setting given both as a flag and with --set, a run setting given
with --resume, a garbage --accelerate-config."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_in_process import TINY, agentrl_in_process, assert_one_line, cli

from agentrl import ConfigError

AGENTRL = [sys.executable, "-m", "agentrl.cli.app"]


def agentrl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``agentrl ARGS`` in a subprocess 200 columns wide: for what only a process shows (what its
    output streams get, --help laid out for the terminal); the other tests run the CLI in-process."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


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
        "[default: math; dataset with --dataset]",
        "[default: grpo]",
        "[default: smollm2-135m]",
        "[default: 40]",
        "[default: the env's]",
    ):
        assert default in text, default


def test_cli_refuses_an_infinite_reward_weight():
    from agentrl.cli.app import _parse_rewards

    with pytest.raises(ConfigError, match=re.escape("--reward 'format:inf': weight 'inf' must be a finite number")):
        _parse_rewards(["format:inf"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-processes", "0"], "--num-processes must be >= 1, got 0"),
        (["--num-processes", "-2"], "--num-processes must be >= 1, got -2"),
        (
            ["--num-generations", "2", "--set", "num_generations=1"],
            "num_generations is given twice with different values: --num-generations 2 and --set 'num_generations=1'; "
            "give it once",
        ),
        (["--seed", "3", "--set", "seed=0"], "seed is given twice with different values: --seed 3 and --set 'seed=0'"),
    ],
)
def test_train_flags_refused_in_one_line(args, message, tmp_path):
    assert_one_line(
        cli("train", "--model", str(tmp_path / "no-model"), "--output-dir", str(tmp_path / "r"), *args), message
    )


@pytest.mark.parametrize(
    "flag",
    [["--seed", "0"], ["--seed", "5"], ["--num-generations", "0"], ["--prompts-per-step", "0"], ["--set", "seed=0"]],
)
def test_resume_refuses_every_given_run_setting_alike(flag, tmp_path):
    assert_one_line(
        cli("train", "--resume", str(tmp_path / "run"), *flag),
        f"--resume continues the run with its own config; drop {flag[0]} (only --max-steps may be given; "
        "--env/--reward only to name the run's own code)",
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe",
            "could not be read as UTF-8 text (an accelerate config is a YAML file): UnicodeDecodeError",
        ),
        (b"compute_environment: [LOCAL_MACHINE\n", "is not valid YAML"),
        (b"- just\n- a list\n", "must hold a YAML mapping of accelerate settings"),
    ],
)
def test_a_garbage_accelerate_config_is_one_line(content, message, tiny_model_dir, tmp_path):
    garbage = tmp_path / "accelerate.yaml"
    garbage.write_bytes(content)
    line = assert_one_line(
        cli(
            "train",
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(tmp_path / "r"),
            "--num-processes",
            "2",
            "--accelerate-config",
            str(garbage),
        ),
        message,
    )
    assert f"--accelerate-config {str(garbage)!r}" in line
