"""Algorithm plugins reach the core only through ``agentrl``'s public API, as a third party would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentrl

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def core_imports(path: Path) -> list[str]:
    """Every ``agentrl.*`` submodule a file imports (``from agentrl import X`` is the public API)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentrl."):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("agentrl.")]
    return found


@pytest.mark.parametrize("plugin", ["agentrl_grpo", "agentrl_ppo", "agentrl_hf_engine", "agentrl_rollouts"])
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
