"""``agentrl new env|reward NAME`` (agentrl.cli.scaffold): an installable package whose test passes
as generated; a request it cannot fulfil (a name too long for a file name included) is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cli_in_process import agentrl_in_process, assert_one_line, cli
from typer.testing import CliRunner

from agentrl.cli.app import app


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: the generated package must import on its own."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def generated_tests_pass(*args: str, cwd: Path) -> str:
    """Run pytest as the generated README says (no install); return its output."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("command", "module", "tests"),
    [
        (["env", "countdown"], "agentrl_env_countdown", 3),
        (["env", "spelling", "--multi-turn"], "agentrl_env_spelling", 3),
        (["env", "shop", "--tools"], "agentrl_env_shop", 6),
        (["reward", "politeness"], "agentrl_reward_politeness", 3),
    ],
)
def test_new_package_is_complete_and_its_test_passes_as_generated(command, module, tests, tmp_path):
    kind, name = command[:2]
    folder = tmp_path / f"pkg-{name}"
    result = agentrl_in_process("new", *command, "--dir", str(folder), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrote {folder}/ ({kind} {name!r}, module {module}):" in result.stdout
    assert f"pip install -e {folder}" in result.stdout and f"pytest {folder / 'tests'}" in result.stdout
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == sorted(["pyproject.toml", "README.md", f"{module}/__init__.py", f"tests/test_{name}.py"])
    pyproject = (folder / "pyproject.toml").read_text()
    assert f'[project.entry-points.agentrl]\n{name}_{kind} = "{module}"' in pyproject
    assert f"{tests} passed" in generated_tests_pass(cwd=folder)  # `pytest` in the package directory


def test_printed_pytest_command_works_from_the_parent_directory(tmp_path):
    result = agentrl_in_process("new", "reward", "brevity", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pytest agentrl-reward-brevity/tests" in result.stdout  # the default directory
    assert "3 passed" in generated_tests_pass("agentrl-reward-brevity/tests", cwd=tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["env", "9lives"],
            "error: env name '9lives' is not valid: use a Python identifier (ASCII letters, digits "
            "and underscores, starting with a letter), e.g. 'countdown'",
        ),
        (["reward", "my-reward"], "error: reward name 'my-reward' is not valid"),
        (
            ["env", "math"],
            "error: env name 'math' is taken: plugin 'math_env' already registers it; pick another name "
            "(agentrl plugins lists the registered ones)",
        ),
        (["reward", "accuracy"], "error: reward name 'accuracy' is taken: plugin 'rewards' already registers it"),
        (
            ["env", "fresh", "--dir", "existing"],
            "error: directory 'existing' already exists; agentrl new never overwrites: pass another --dir or remove it",
        ),
        (
            ["env", "fresh", "--tools", "--multi-turn"],
            "error: --multi-turn and --tools are exclusive: a tool env is "
            "multi-turn already (one turn per round of tool calls); pick one",
        ),
    ],
)
def test_bad_requests_are_one_line_errors_with_exit_status_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    result = CliRunner().invoke(app, ["new", *args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(message) and result.output.count("\n") == 1, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]  # nothing written


def test_tool_env_package_is_a_tool_env_whose_reward_needs_its_tool_and_trains(tmp_path, tiny_model_dir):
    folder = tmp_path / "shop"
    assert agentrl_in_process("new", "env", "shop", "--tools", "--dir", str(folder)).returncode == 0
    source = (folder / "agentrl_env_shop" / "__init__.py").read_text()
    assert "class ShopEnv(ToolEnv):" in source and "def price(self, item: str, quantity: int = 1) -> int:" in source
    readme = (folder / "README.md").read_text()
    assert "`ShopEnv` in `agentrl_env_shop/__init__.py`, an `agentrl.ToolEnv`" in readme and "$" not in readme
    spec = f"{folder / 'agentrl_env_shop' / '__init__.py'}:ShopEnv"  # no install: the file itself
    result = agentrl_in_process(
        "train",
        "--env",
        spec,
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=8",
        "--set",
        "save_model=false",
        "--output-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rewards: env return x1 + tool_use x0.2 (the env's defaults)" in result.stdout
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss/policy" in m] == [1, 2]
    assert all("rollout/tool_calls_mean" in m and "reward/tool_use_mean" in m for m in metrics)


def test_installed_env_package_is_listed_trains_and_is_gone_after_uninstall(tmp_path, tiny_model_dir, plugin_venv):
    """pip install -e of the generated package (into a venv layered over the test venv, which the
    tests running beside this one do not see): listed, trained by name, gone after uninstall."""
    name = f"scaffold_{uuid.uuid4().hex[:8]}"
    dist, folder = f"agentrl-env-{name}", tmp_path / "package"
    assert agentrl_in_process("new", "env", name, "--dir", str(folder)).returncode == 0
    train = [
        "train",
        "--env",
        name,
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "2",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=8",
        "--set",
        "save_model=false",
    ]
    installed = plugin_venv.pip("install", "--no-deps", "--no-build-isolation", "-e", str(folder))
    try:
        assert installed.returncode == 0, installed.stdout + installed.stderr
        rows = {row["name"]: row for row in json.loads(plugin_venv.agentrl("plugins", "--json").stdout)}
        assert rows[f"{name}_env"] == {
            "name": f"{name}_env",
            "module": f"agentrl_env_{name}",
            "distribution": dist,
            "version": "0.1.0",
            "registers": {"env": [name]},
        }
        result = plugin_venv.agentrl(*train, "--output-dir", str(tmp_path / "run"), cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"run saved to {tmp_path / 'run'}" in result.stdout
        metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics if "loss/policy" in m] == [1, 2]
    finally:
        removed = plugin_venv.pip("uninstall", "-y", dist)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert f"{name}_env" not in {row["name"] for row in json.loads(plugin_venv.agentrl("plugins", "--json").stdout)}
    gone = plugin_venv.agentrl(*train, "--output-dir", str(tmp_path / "run2"), cwd=tmp_path)
    output = gone.stdout + gone.stderr
    assert gone.returncode == 2 and f"error: unknown env {name!r}" in output and "Traceback" not in output, output


def test_new_with_a_name_too_long_for_a_file_name_is_one_line(tmp_path):
    name = "a" * 300
    assert_one_line(
        cli("new", "env", name, "--dir", str(tmp_path / "pkg")),
        "env name 'aaaaaaaaaaaaaaaaaaaa'... is 300 characters long: at most 64 (it names the package's "
        "folder and files)",
    )
    assert not (tmp_path / "pkg").exists()
    deep = tmp_path / ("b" * 300)
    assert_one_line(
        cli("new", "reward", "ok", "--dir", str(deep)),
        f"could not write {str(deep)!r}: File name too long; nothing was kept",
    )
