"""agentrl/cli/train.py (the `agentrl train` command): ``--print-config`` shows each key's description above it, and stays YAML."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from agentrl.cli.app import app
from agentrl.cli.train import described
from agentrl.config.reference import config_reference


def test_print_config_describes_each_top_level_key_and_loads_as_the_same_yaml():
    result = CliRunner().invoke(app, ["train", "--print-config", "--max-steps", "3"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert (
        lines[lines.index("max_steps: 3") - 1] == "# Optimizer steps (one rollout batch each, times `num_iterations`)."
    )
    assert lines[lines.index("env: math") - 1].startswith("# Environment name (`agentrl plugins` lists them)")
    documented = {key.name for key in config_reference() if key.doc}
    commented = {line.split(":")[0] for before, line in zip(lines, lines[1:]) if before.startswith("# ")}
    assert commented == documented & set(yaml.safe_load(result.output))


def test_described_cuts_at_the_first_sentence_but_not_at_e_g():
    text = described("algorithm: {}\nmodel: x\nnot_a_key: 1\n")
    assert text.splitlines() == [
        "# Options of the algorithm (validated by its config class, e.g. GRPOConfig).",
        "algorithm: {}",
        "# Local HF folder, run dir, hub id, or alias (`smollm2-135m`: the embedded default).",
        "model: x",
        "not_a_key: 1",
    ]
