"""Options generated from TrainConfig fields (agentrl.cli.options): name, type, help and default
from the field, None when not given, the command's own options kept."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from agentrl.cli.options import ConfigOption, ConfigOptions, field_docs
from agentrl.cli.train import TRAIN_OPTIONS
from agentrl.config.train import TrainConfig


def command(options: ConfigOptions) -> tuple[typer.Typer, list[Any]]:
    """A one-command app built with ``options``; the list receives each call's (given, own option)."""
    calls: list[Any] = []

    @options.command
    def run(given: dict[str, Any], tag: str = typer.Option("x", "--tag", help="Own option.")) -> None:
        """Record the call."""
        calls.append((given, tag))

    app = typer.Typer(rich_markup_mode=None, add_completion=False)
    app.command()(run)
    app.command("other")(lambda: None)  # two commands: "run" is a subcommand, as in agentrl
    return app, calls


def test_generated_options_parse_to_the_field_type_and_are_none_when_not_given():
    app, calls = command(ConfigOptions("max_steps", ConfigOption("rewards", "--reward", list[str], "Rewards.")))
    runner = CliRunner()
    assert runner.invoke(app, ["run", "--max-steps", "7", "--reward", "a", "--reward", "b:2"]).exit_code == 0
    assert runner.invoke(app, ["run", "--tag", "y"]).exit_code == 0
    assert calls == [
        ({"--max-steps": 7, "--reward": ["a", "b:2"]}, "x"),
        ({"--max-steps": None, "--reward": None}, "y"),
    ]
    bad = runner.invoke(app, ["run", "--max-steps", "many"])
    assert bad.exit_code == 2 and "Invalid value for '--max-steps'" in bad.output


def test_help_is_the_field_docstring_with_its_default():
    app, _ = command(ConfigOptions("prompts_per_step", ConfigOption("output_dir", help="Run dir.", default_text="X")))
    text = " ".join(CliRunner().invoke(app, ["run", "--help"]).output.split())
    assert field_docs(TrainConfig)["prompts_per_step"] == (
        "Tasks sampled per step; each is rolled out num_generations times."
    )
    assert (
        "--prompts-per-step <int> Tasks sampled per step; each is rolled out num_generations times. "
        "[default: 4]" in text
    )
    assert "--output-dir <str> Run dir. [default: X]" in text and "--tag <str> Own option." in text


def test_values_parse_given_options_into_config_keys():
    given = {
        "--env": None,
        "--algo": "ppo",
        "--model": None,
        "--engine": None,
        "--reward": ["accuracy:0.5"],
        "--max-steps": 0,
        "--num-generations": None,
        "--prompts-per-step": None,
        "--dataset": "tasks.jsonl",
        "--output-dir": None,
        "--seed": None,
    }
    values = TRAIN_OPTIONS.values(given)
    assert values["algo"] == ("--algo", "ppo") and values["max_steps"] == ("--max-steps", 0)
    assert values["rewards"] == ("--reward", {"accuracy": 0.5}) and values["env"] == ("--env", None)
    assert values["dataset"] == ("--dataset", {"path": "tasks.jsonl"})
    flags = TRAIN_OPTIONS.flags
    assert flags["rewards"] == "--reward" and flags["num_generations"] == "--num-generations"


def test_a_declaration_naming_no_field_or_clashing_with_an_own_option_is_refused():
    with pytest.raises(ValueError, match=re.escape("not TrainConfig fields: max_step")):
        ConfigOptions("max_step")
    with pytest.raises(ValueError, match=re.escape("run has parameters named as TrainConfig options: seed")):

        @ConfigOptions("seed").command
        def run(given: dict[str, Any], seed: int = 0) -> None:
            """Clash."""
