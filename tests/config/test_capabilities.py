"""The capability table (agentrl/config/capabilities.py): every supported combination is covered by
tests that exist, every refused one fails at start-up with its reason, before any model loads."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import yaml
from cli_in_process import agentrl_in_process

from agentrl import ConfigError, Engine
from agentrl.cli.capabilitydoc import counts
from agentrl.config import capabilities as cap
from agentrl.config.startup import check_startup, resolve_settings
from agentrl.config.train import build_config
from agentrl.plugins import load_plugins

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def registry():
    return load_plugins().registry


@functools.cache
def functions_in(path: str) -> frozenset[str]:
    """The test functions defined in the file at ``path`` (relative to the repository root)."""
    tree = ast.parse((ROOT / path).read_text())
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))


def exists(test_id: str) -> bool:
    """Whether ``test_id`` (``path::function``, or ``path::function[id]`` of a parametrized case whose
    id the file spells as a string) names a test function of that file."""
    path, _, name = test_id.partition("::")
    name, _, case = name.partition("[")
    if not ((ROOT / path).is_file() and name.startswith("test_") and name in functions_in(path)):
        return False
    return not case or (case.endswith("]") and f'"{case[:-1]}"' in (ROOT / path).read_text())


def config_for(combination: dict[str, str]):
    """The run config of ``combination``, built as ``agentrl train`` builds one (flags and --set)."""
    sets = [
        f"rollout={combination['rollout']}",
        f"async_steps={1 if combination['async'] == 'on' else 0}",
        f"precision={combination['precision']}",
    ] + (["lora={}"] if combination["lora"] == "on" else [])
    return build_config(overrides={"engine": combination["engine"], "algo": combination["algorithm"]}, sets=sets)


def test_every_supported_combination_is_covered_by_tests_that_exist() -> None:
    supported = [c for c in cap.combinations() if cap.refusal(c) is None]
    for combination in supported:
        gaps = [group for group, tests in cap.covering(combination).items() if not tests]
        assert not gaps, f"{combination}: no test runs {gaps[0]} together; add one or refuse it"
        ids = {test for entries in cap.covering(combination).values() for entry in entries for test in entry.tests}
        assert ids and all(exists(test) for test in ids), combination
    missing = [test for entry in cap.TESTED for test in entry.tests if not exists(test)]
    assert not missing, f"tests named in the capability table that do not exist: {missing}"
    assert len(supported) == counts()[0] > 0
    print(f"\ncapabilities: {len(supported)} supported combinations, each covered by existing tests")


def test_every_refused_combination_fails_at_start_up_with_its_reason() -> None:
    refused = 0
    for combination in cap.combinations():
        rule = cap.refusal(combination)
        if rule is None:
            continue
        refused += 1
        with pytest.raises(ConfigError) as caught:
            check_startup(config_for(combination), registry(), processes=combination["processes"])
        assert str(caught.value) == cap.message(combination, rule), combination
        assert rule.because in str(caught.value) and "\n" not in str(caught.value)
    assert refused == counts()[1] > 0
    print(f"\ncapabilities: {refused} refused combinations, each refused at start-up")


def test_supported_combinations_pass_the_check() -> None:
    for combination in cap.combinations():
        if cap.refusal(combination) is None:
            cap.check_combination(config_for(combination), registry(), combination["processes"])


def test_every_rule_is_the_reason_for_some_combination_and_no_test_runs_a_refused_one() -> None:
    reasons = {id(cap.refusal(c)) for c in cap.combinations()}
    assert all(id(rule) in reasons for rule in cap.REFUSED), "a rule every earlier rule already covers"
    for entry in cap.TESTED:
        assert set(entry.when) <= set(cap.DIMENSIONS)
        assert all(entry.when[key] in cap.DIMENSIONS[key] for key in entry.when)
        if entry.whole_run:
            assert cap.refusal(entry.point) is None, f"{entry.tests} run a combination the table refuses"
        else:
            assert any(
                cap.refusal(c) is None and all(c[k] == v for k, v in entry.when.items()) for c in cap.combinations()
            ), entry


def test_the_message_names_the_values_the_reason_and_what_is_allowed() -> None:
    combination = {**cap.DEFAULTS, "engine": "vllm", "processes": "n"}
    text = cap.message(combination, cap.refusal(combination))
    assert text.startswith("--engine vllm with --num-processes > 1 is not supported: not tested together yet")
    assert "supported instead: --engine hf, or one process" in text
    sharded = {**cap.DEFAULTS, "lora": "on", "processes": "sharded"}
    assert cap.message(sharded, cap.refusal(sharded)).startswith(
        "lora with sharded weights (--accelerate-config fsdp / zero3) is not supported: LoRA on sharded weights"
    )


def test_the_launched_processes_are_read_from_the_environment(monkeypatch) -> None:
    config = build_config(overrides={"engine": "vllm"})
    check_startup(config, registry())  # one process: supported
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=re.escape("--engine vllm with --num-processes > 1 is not supported")):
        resolve_settings(config, registry())  # what build_run and --print-config go through
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert cap.processes_from_environment() == "sharded"
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    assert cap.processes_from_environment() == "sharded"
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert cap.processes_from_environment() == "1"


@pytest.mark.parametrize(("name", "count", "expected"), [("ddp", 2, "n"), ("zero2", 2, "n"), ("fsdp", 1, "sharded")])
def test_the_shipped_accelerate_configs_map_to_their_processes_value(name, count, expected) -> None:
    settings = yaml.safe_load((ROOT / "agentrl" / "model" / "accelerate_configs" / f"{name}.yaml").read_text())
    assert cap.launch_processes(count, settings) == expected
    assert cap.launch_processes(1, None) == "1" and cap.launch_processes(3, None) == "n"
    zero3 = yaml.safe_load((ROOT / "agentrl" / "model" / "accelerate_configs" / "zero3.yaml").read_text())
    assert cap.launch_processes(2, zero3) == "sharded"


def test_the_cli_refuses_before_launching_or_loading_a_model(tmp_path) -> None:
    result = agentrl_in_process(
        "train",
        "--engine",
        "vllm",
        "--model",
        str(tmp_path / "no-such-model"),  # loading it would fail differently
        "--num-processes",
        "2",
        "--output-dir",
        str(tmp_path / "run"),
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --engine vllm with --num-processes > 1 is not supported")
    assert "launching" not in result.stdout
    sharded = agentrl_in_process(
        "train", "--set", "lora.r=4", "--accelerate-config", "fsdp", "--output-dir", str(tmp_path / "run2")
    )
    assert sharded.returncode == 2 and "lora with sharded weights" in sharded.stderr


class OneProcessEngine(Engine):
    """A third-party engine that declares it runs in one process only."""

    unsupported = (cap.Refused({"processes": ("n", "sharded")}, "it keeps its state in this process"),)


def test_a_third_party_plugin_declares_its_own_refusals() -> None:
    manager = load_plugins()
    manager.registry.add("engine", "solo", OneProcessEngine, "test")
    config = build_config(overrides={"engine": "solo"})
    check_startup(config, manager.registry, processes="1")
    with pytest.raises(ConfigError) as caught:
        check_startup(config, manager.registry, processes="n")
    assert str(caught.value).startswith(
        "--engine solo with --num-processes > 1 is not supported: it keeps its state in this process; "
        "supported instead: --engine hf, or one process"
    )
    OneProcessEngine.unsupported = (cap.Refused({"gpus": "2"}, "?"),)
    try:
        with pytest.raises(ConfigError, match=r"engine 'solo' declares unsupported=.*each must be a Refused rule"):
            check_startup(config, manager.registry, processes="1")
    finally:
        OneProcessEngine.unsupported = (cap.Refused({"processes": ("n", "sharded")}, "it keeps its state"),)
