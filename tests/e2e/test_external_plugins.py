"""Third-party plugins as users get them: real packages built and pip-installed into a venv (one
layered over the test venv, so the tests running beside these do not see them), found through the
``agentrl`` entry-point group, trained with through the CLI, uninstalled; a package that fails to
import or registers a taken name is named with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PluginVenv

TINY = [
    "--max-steps",
    "2",
    "--num-generations",
    "2",
    "--prompts-per-step",
    "2",
    "--set",
    "eval_tasks=2",
    "--set",
    "max_new_tokens=8",
]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "{version}"
dependencies = ["agentrl"]

[project.entry-points.agentrl]
{entry} = "{module}"

[tool.setuptools]
py-modules = ["{module}"]
"""

REWARD_MODULE = '''
"""A TRL-style reward (TRL's signature, unchanged) shipped as an agentrl plugin."""
from agentrl import hookimpl


def exclaim(completions, **kwargs):
    """1.0 for a completion with an exclamation mark (TRL conversational completions)."""
    return [float("!" in completion[-1]["content"]) for completion in completions]


@hookimpl
def agentrl_register_rewards(register):
    register("exclaim", exclaim)
'''

ENV_MODULE = '''
"""A single-turn env shipped as an agentrl plugin: repeat a number."""
from agentrl import Env, hookimpl


class EchoEnv(Env):
    """Reply with the number; reward 1.0 when the reply contains it."""

    def train_tasks(self):
        return [{"question": f"Say {n}.", "answer": str(n)} for n in range(10, 30)]

    def eval_tasks(self):
        return [{"question": f"Say {n}.", "answer": str(n)} for n in range(30, 34)]

    def start(self, task):
        return [{"role": "user", "content": task["question"]}]

    def respond(self, text):
        correct = self.task["answer"] in text
        return [], float(correct), True, {"success": correct}

    def gold_reply(self, task):
        return task["answer"]


@hookimpl
def agentrl_register_envs(register):
    register("echo", EchoEnv)
'''

BROKEN_MODULE = "import a_module_that_does_not_exist\n"

DUPLICATE_MODULE = """
from agentrl import hookimpl


@hookimpl
def agentrl_register_rewards(register):
    register("format", lambda trajectories: [0.0] * len(trajectories))
"""


def write_package(root: Path, dist: str, module: str, entry: str, source: str, version: str = "1.2.3") -> Path:
    folder = root / dist
    folder.mkdir()
    (folder / "pyproject.toml").write_text(PYPROJECT.format(dist=dist, module=module, entry=entry, version=version))
    (folder / f"{module}.py").write_text(source)
    return folder


def pip(venv: PluginVenv, *args: str) -> None:
    result = venv.pip(*args)
    assert result.returncode == 0, result.stdout + result.stderr


def test_installed_reward_and_env_packages_train_then_are_gone_after_uninstall(tiny_model_dir, tmp_path, plugin_venv):
    reward_pkg = write_package(
        tmp_path, "agentrl-reward-exclaim", "agentrl_reward_exclaim", "exclaim_reward", REWARD_MODULE
    )
    env_pkg = write_package(tmp_path, "agentrl-env-echo", "agentrl_env_echo", "echo_env", ENV_MODULE, "0.4.0")
    try:
        pip(plugin_venv, "install", "--no-deps", "--no-build-isolation", str(reward_pkg), str(env_pkg))
        rows = {row["name"]: row for row in json.loads(plugin_venv.agentrl("plugins", "--json").stdout)}
        assert rows["exclaim_reward"]["distribution"] == "agentrl-reward-exclaim"
        assert rows["exclaim_reward"]["version"] == "1.2.3" and rows["exclaim_reward"]["registers"] == {
            "reward": ["exclaim"]
        }
        assert rows["echo_env"]["distribution"] == "agentrl-env-echo" and rows["echo_env"]["version"] == "0.4.0"
        assert rows["echo_env"]["registers"] == {"env": ["echo"]}

        out = tmp_path / "run"
        result = plugin_venv.agentrl(
            "train",
            "--env",
            "echo",
            "--reward",
            "exclaim:0.2",
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(out),
            *TINY,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "rewards: env return x1 + exclaim x0.2 (--reward)" in " ".join(result.stdout.split())
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines[:2]] == [1, 2] and "reward/exclaim_mean" in lines[0]
    finally:
        pip(plugin_venv, "uninstall", "-y", "agentrl-reward-exclaim", "agentrl-env-echo")
    gone = ["--output-dir", str(tmp_path / "gone"), "--set", "eval_tasks=0"]
    missing = plugin_venv.agentrl("train", "--env", "echo", *gone)
    assert missing.returncode == 2 and "unknown env 'echo'" in missing.stderr
    missing = plugin_venv.agentrl("train", "--reward", "exclaim", *gone)
    assert missing.returncode == 2 and "unknown reward 'exclaim'" in missing.stderr
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (
            BROKEN_MODULE,
            "plugin 'bad_plugin' (entry point 'agentrl_bad_plugin' of agentrl-bad-plugin) failed to import: "
            "ModuleNotFoundError(\"No module named 'a_module_that_does_not_exist'\"). Fix or uninstall it, "
            "or disable it with --disable-plugin bad_plugin.",
        ),
        (
            DUPLICATE_MODULE,
            "reward 'format' is registered by two plugins: 'rewards' and 'bad_plugin'. Uninstall or "
            "disable one of them (--disable-plugin NAME).",
        ),
    ],
    ids=["fails-to-import", "duplicate-name"],
)
def test_a_broken_installed_plugin_is_named_with_the_fix(module: str, message: str, tmp_path, plugin_venv) -> None:
    package = write_package(tmp_path, "agentrl-bad-plugin", "agentrl_bad_plugin", "bad_plugin", module)
    try:
        pip(plugin_venv, "install", "--no-deps", "--no-build-isolation", str(package))
        result = plugin_venv.agentrl("plugins")
        assert result.returncode == 2 and message in " ".join(result.stderr.split()), result.stderr
        assert "Traceback" not in result.stderr
        assert plugin_venv.agentrl("plugins", "--disable-plugin", "bad_plugin").returncode == 0
    finally:
        pip(plugin_venv, "uninstall", "-y", "agentrl-bad-plugin")
    assert plugin_venv.agentrl("plugins").returncode == 0
