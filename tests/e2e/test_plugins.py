"""Plugins given on the command line (agentrl.plugins through ``agentrl plugins`` and ``agentrl
train``): a plugin file relative to the current directory is loaded and listed with what it
registers, ``--disable-plugin`` takes a plugin's names away, and a misspelt hook or a hook with a
wrong signature is named in one line with the fix."""

from __future__ import annotations

import json

from cli_in_process import agentrl_in_process

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
