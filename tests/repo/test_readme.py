"""README.md opens with exactly two commands, and CI runs the second one verbatim; its examples run.

The algorithm and step-hook examples that were in the README live in the guides now
(docs/guides/algorithms.md, docs/guides/plugins.md); they are run here as they were."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS_GUIDE = ROOT / "docs" / "guides" / "algorithms.md"
PLUGINS_GUIDE = ROOT / "docs" / "guides" / "plugins.md"


def python_blocks(path: Path) -> list[str]:
    """The fenced ``python`` blocks of a Markdown file that run as written (a ``# docs-test: tiny``
    block trains, so tests/repo/test_docs.py runs it on a tiny model instead)."""
    blocks = re.findall(r"```python\n(.*?)\n```", path.read_text(), flags=re.S)
    return [block for block in blocks if not block.startswith("# docs-test:")]


def test_readme_opens_with_train_and_test_commands_and_ci_runs_the_test_one():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    train, tests = blocks[0].strip(), blocks[1].strip()
    assert train.endswith("agentrl train --env math --algo grpo") and "pip install torch==2.13.0" in train
    assert "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_readme_envs_pass_check_env_and_their_gold_answers_score_one():
    """Every Env class in README's Python blocks runs as written and passes ``check_env``."""
    import agentrl
    from agentrl.testing import check_env

    blocks = python_blocks(ROOT / "README.md")
    classes = {}
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)
        classes.update(
            {
                name: value
                for name, value in namespace.items()
                if isinstance(value, type)
                and issubclass(value, agentrl.Env)
                and value.__module__ != "agentrl.env"
                and value not in (agentrl.Env, agentrl.ToolEnv)
            }
        )
    assert set(classes) == {"Countdown", "Capitals"}
    for cls in classes.values():
        check_env(cls)
    env = classes["Capitals"]()
    task = env.eval_tasks()[0]
    messages, _ = env.reset(seed=0, options={"task": task})
    assert messages[-1]["content"] == "What is the capital of Peru?" and len(messages) == 6
    obs, reward, terminated, _, _ = env.step(agentrl.format_tool_call("capital", country="Peru"))
    assert obs[0]["content"] == "Lima" and (reward, terminated) == (0.0, False)
    obs, _, _, _, _ = env.step(agentrl.format_tool_call("capital", country="Atlantis"))
    assert obs[0]["content"] == "Error: ValueError: unknown country 'Atlantis'"
    assert env.step("The capital is Lima.")[1:3] == (1.0, True)


def test_guide_algorithm_plugin_trains_a_step(tiny_model_dir, tmp_path):
    """The algorithms guide's REINFORCE example, registered as a plugin, runs one real training step."""
    import sys
    import types

    import torch

    from agentrl.config.train import TrainConfig
    from agentrl.plugins import load_plugins
    from agentrl.training.trainer import Trainer

    (block,) = [b for b in python_blocks(ALGORITHMS_GUIDE) if "class Reinforce(Algorithm)" in b]
    module = types.ModuleType("readme_reinforce")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(block, "README.md", "exec"), module.__dict__)
    manager = load_plugins()
    manager.register_plugin(module, name="readme_reinforce")
    config = TrainConfig(
        model=str(tiny_model_dir),
        algo="reinforce",
        max_steps=1,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        save_model=False,
        log_completions_every=0,
        learning_rate=1e-2,
        rewards={"format": 1.0},
        algorithm={"baseline": 0.5},
    )
    trainer = Trainer(config, manager)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_guide_step_hook_plugin_is_configured_by_its_section(tiny_model_dir, tmp_path):
    """The plugins guide's step-hook example: its section validates, lists resolved, and masks the loss."""
    import sys
    import types

    import pytest

    from agentrl import ConfigError
    from agentrl.config.startup import resolved_dict
    from agentrl.config.train import TrainConfig
    from agentrl.plugins import load_plugins
    from agentrl.training.trainer import Trainer

    (block,) = [b for b in python_blocks(PLUGINS_GUIDE) if "class MaxLengthConfig" in b]
    module = types.ModuleType("readme_max_length")
    sys.modules[module.__name__] = module
    exec(compile(block, "README.md", "exec"), module.__dict__)
    manager = load_plugins()
    manager.register_plugin(module, name="readme_max_length")
    config = TrainConfig(
        model=str(tiny_model_dir),
        max_steps=1,
        prompts_per_step=2,
        num_generations=2,
        max_new_tokens=6,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        save_model=False,
        log_completions_every=0,
        plugins={"max_length": {"max_tokens": 3}},
    )
    assert resolved_dict(TrainConfig(), manager)["plugins"]["max_length"] == {"max_tokens": 0}
    with pytest.raises(ConfigError, match="plugins.max_length.max_tokens=-1 is invalid"):
        Trainer(TrainConfig(model=str(tiny_model_dir), plugins={"max_length": {"max_tokens": -1}}), manager)
    trainer = Trainer(config, manager)
    batch, _, metrics = trainer.rollout_step(1)
    assert int(batch.loss_mask.sum(dim=1).max()) > 3  # the tiny model runs to the 6-token cap
    trainer.update(batch, metrics)
    assert metrics["max_length/frac_dropped"] == 1.0 and float(batch.loss_mask.sum()) == 0.0


def test_readme_is_the_front_door_not_a_lab_notebook():
    """Short; no dated entries, per-seed history or references outside the repository (the
    measurements live in docs/benchmarks, the history in CHANGELOG.md); it names the three ways to
    bring an agent and links the docs it leaves out."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "2026-" not in text and not re.search(r"TRAPS|[Ii]ssue \d+|seed \d{3}", text)
    assert all(name in text for name in ("class Countdown(Env)", "class Capitals(ToolEnv)", "openai_agent"))
    for target in ("docs/benchmarks/index.md", "CHANGELOG.md", "docs/concepts/guards.md", "docs/reference/config.md"):
        assert f"]({target}" in text and (ROOT / target).is_file(), target
