"""Built-in plugins and envs reach the core only through ``agentrl``'s public API, as a third party would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentrl

ROOT = Path(__file__).resolve().parents[2]
BUILT_INS = sorted(
    path for folder in ("plugins", "envs") for path in (ROOT / folder).iterdir() if (path / "__init__.py").is_file()
)
"""Every built-in plugin and env package: none is exempt."""


def core_imports(source: str) -> list[str]:
    """What a file's source imports from agentrl that is not public: ``agentrl.X`` modules other
    than :data:`agentrl.PUBLIC_MODULES`, and names ``from agentrl import`` that are not in
    ``agentrl.__all__``. Imports inside functions count too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "agentrl":
                found += [f"agentrl.{a.name}" for a in node.names if a.name not in agentrl.__all__]
            elif node.module.startswith("agentrl.") and node.module not in agentrl.PUBLIC_MODULES:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [
                a.name for a in node.names if a.name.startswith("agentrl.") and a.name not in agentrl.PUBLIC_MODULES
            ]
    return found


def test_built_ins_are_all_covered():
    names = {path.name for path in BUILT_INS}
    assert {
        "agentrl_grpo",
        "agentrl_gspo",
        "agentrl_ppo",
        "agentrl_vllm_engine",
        "agentrl_math",
        "agentrl_tool_envs",
        "agentrl_verifiers",
    } <= names
    assert len(names) == 18, sorted(names)


@pytest.mark.parametrize("package", BUILT_INS, ids=lambda path: path.name)
def test_built_in_imports_only_the_public_api(package):
    files = sorted(package.rglob("*.py"))
    assert files
    for path in files:
        assert core_imports(path.read_text()) == [], f"{package.name}/{path.name} imports core internals"


def test_built_ins_do_not_import_each_other():
    """A built-in reaches another's code only through the core (GSPO shares GRPO's base there)."""
    names = {path.name for path in BUILT_INS}
    for package in BUILT_INS:
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                modules = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module
                    else [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else []
                )
                others = {m.split(".")[0] for m in modules} & (names - {package.name})
                assert not others, f"{package.name}/{path.name} imports {sorted(others)}"


def own_package_imports(package: Path) -> list[str]:
    """Where a module of ``package`` (its ``__init__`` aside) imports a name from the package's
    ``__init__`` (``from pkg import name`` that is no submodule, or ``import pkg``), inside functions
    and under ``TYPE_CHECKING`` too: ``module: name``."""
    submodules = {path.stem for path in package.glob("*.py")} | {
        path.parent.name for path in package.glob("*/__init__.py")
    }
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == package.name:
                found += [f"{path.name}: {a.name}" for a in node.names if a.name not in submodules]
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module:
                found += [f"{path.name}: {a.name}" for a in node.names if a.name not in submodules]
            elif isinstance(node, ast.Import):
                found += [f"{path.name}: {a.name}" for a in node.names if a.name == package.name]
    return found


@pytest.mark.parametrize("package", BUILT_INS, ids=lambda path: path.name)
def test_built_in_modules_do_not_import_their_own_package(package):
    """A module of a built-in imports what it shares with its siblings from the sibling that
    defines it, never from the package's ``__init__`` (which imports the modules: a cycle)."""
    assert own_package_imports(package) == []


def test_own_package_imports_finds_imports_of_the_package(tmp_path):
    package = tmp_path / "agentrl_thing"
    package.mkdir()
    (package / "__init__.py").write_text("from agentrl_thing.core import Thing\n")
    (package / "core.py").write_text("class Thing:\n    pass\n")
    (package / "helper.py").write_text(
        "from typing import TYPE_CHECKING\nfrom agentrl_thing import core\nif TYPE_CHECKING:\n"
        "    from agentrl_thing import Thing\ndef f():\n    import agentrl_thing\n    from . import Thing\n"
    )
    assert own_package_imports(package) == ["helper.py: Thing", "helper.py: agentrl_thing", "helper.py: Thing"]


@pytest.mark.parametrize(
    "source, found",
    [
        ("from agentrl.env import seeded_rng", ["agentrl.env"]),
        ("def f():\n    from agentrl.errors import one_line", ["agentrl.errors"]),
        ("import agentrl.tools.tool", ["agentrl.tools.tool"]),
        ("from agentrl import _private_thing", ["agentrl._private_thing"]),
        ("from agentrl import Env, seeded_rng\nfrom agentrl.answers import extract_boxed", []),
    ],
)
def test_core_imports_finds_private_imports(source, found):
    assert core_imports(source) == found


def test_public_modules_import():
    import importlib

    for module in agentrl.PUBLIC_MODULES:
        assert importlib.import_module(module).__doc__, module


def test_public_api_names_exist():
    for name in agentrl.__all__:
        assert hasattr(agentrl, name), name
    for name in (
        "Algorithm",
        "LossContext",
        "SetupContext",
        "TrainableModule",
        "policy_loss",
        "AGGREGATIONS",
        "KL_ESTIMATORS",
        "build_plugin_config",
        "ConfigCheck",
        "Allowed",
        "Complaint",
        "OneOf",
        "check_declared",
        "step_totals",
        "ClippedPolicy",
        "ClippedPolicyConfig",
        "GroupRelative",
        "GroupRelativeConfig",
        "group_advantages",
        "seeded_rng",
        "SeedTasks",
        "PrivateGlobalRandom",
        "library_call",
        "import_extra",
        "run_python",
        "parse_xml_json",
        "GenerationRequest",
        "RequestQueue",
        "request_queue",
        "Engine",
        "Rollout",
    ):
        assert name in agentrl.__all__, name


def test_every_registered_rollout_runs_as_the_rollout_protocol_says():
    """The loop calls ``rollout.run(envs, tasks, groups, sampling, seeds=...)``: every built-in
    rollout takes exactly :class:`agentrl.Rollout`'s arguments, ``seeds`` optional."""
    import inspect

    from agentrl.plugins import load_plugins

    registry = load_plugins().registry
    expected = inspect.signature(agentrl.Rollout.run).parameters
    assert list(expected) == ["self", "envs", "tasks", "groups", "sampling", "seeds"]
    for name in registry.names("rollout"):
        run = inspect.signature(registry.get("rollout", name).factory.run).parameters
        assert list(run) == list(expected), name
        assert run["seeds"].default is None, name


def test_reward_plugin_does_not_need_the_math_env(monkeypatch):
    """Answer parsing is core (agentrl.answers): the rewards plugin works without the math env."""
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "agentrl_math", None)  # importing it now raises ImportError
    monkeypatch.delitem(sys.modules, "agentrl_rewards", raising=False)
    rewards = importlib.import_module("agentrl_rewards")
    from agentrl.testing import make_trajectory

    trajectory = make_trajectory(
        [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}], {"answer": "2"}
    )
    assert rewards.accuracy_reward([trajectory]) == [1.0]


def test_clipped_policy_algorithms_share_the_core_loss():
    """GRPO, GSPO and PPO take their clipped-policy options and loss from the core, not each other."""
    import dataclasses

    from agentrl_grpo import GRPO, GRPOConfig
    from agentrl_gspo import GSPO, GSPOConfig
    from agentrl_ppo import PPO, PPOConfig

    for algorithm in (GRPO, GSPO, PPO):
        assert issubclass(algorithm, agentrl.ClippedPolicy) and "clipped_policy_loss" not in vars(algorithm)
    assert issubclass(GRPO, agentrl.GroupRelative) and issubclass(GSPO, agentrl.GroupRelative)
    shared = {f.name for f in dataclasses.fields(agentrl.ClippedPolicyConfig)}
    for config in (GRPOConfig, GSPOConfig, PPOConfig):
        assert shared <= {f.name for f in dataclasses.fields(config)}, config.__name__
