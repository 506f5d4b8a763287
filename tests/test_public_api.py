"""Algorithm plugins reach the core only through ``agentrl``'s public API, as a third party would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentrl

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
PUBLIC_MODULES = {"agentrl.answers"}
"""Core modules that are public API besides ``agentrl`` itself."""


def core_imports(path: Path) -> list[str]:
    """Every ``agentrl.*`` submodule a file imports (``from agentrl import X`` is the public API)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentrl."):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("agentrl.")]
    return [module for module in found if module not in PUBLIC_MODULES]


@pytest.mark.parametrize("plugin", ["agentrl_grpo", "agentrl_ppo", "agentrl_hf_engine", "agentrl_rollouts",
                                    "agentrl_rewards", "agentrl_gspo", "agentrl_sampler_correction"])
def test_plugin_imports_only_the_public_api(plugin):
    files = sorted((PLUGINS / plugin).rglob("*.py"))
    assert files
    for path in files:
        assert core_imports(path) == [], f"{path.name} imports core internals"


def test_public_api_names_exist():
    for name in agentrl.__all__:
        assert hasattr(agentrl, name), name
    for name in ("Algorithm", "LossContext", "SetupContext", "TrainableModule", "policy_loss", "AGGREGATIONS",
                 "KL_ESTIMATORS", "build_plugin_config", "step_totals"):
        assert name in agentrl.__all__, name


def test_reward_plugin_does_not_need_the_math_env(monkeypatch):
    """Answer parsing is core (agentrl.answers): the rewards plugin works without the math env."""
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "agentrl_math", None)  # importing it now raises ImportError
    monkeypatch.delitem(sys.modules, "agentrl_rewards", raising=False)
    rewards = importlib.import_module("agentrl_rewards")
    from agentrl.testing import make_trajectory

    trajectory = make_trajectory([{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}],
                                 {"answer": "2"})
    assert rewards.accuracy_reward([trajectory]) == [1.0]
