"""Every form ``--reward`` takes, and the one line for a value that is none of them: an unknown name
lists the installed rewards, each scheme's form and the function specs; a bare folder holding a
reward model is used as ``rm:/abs/folder`` (as TRL's ``reward_funcs="path/to/rm"``); a folder
holding another model is refused naming the scheme that takes it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForSequenceClassification, LlamaForTokenClassification

from agentrl import hookimpl
from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, PluginError
from agentrl.plugins import load_plugins
from agentrl.rewards import schemes
from agentrl.rewards.schemes import RewardContext, bare_folder, canonical_reward, with_absolute_paths
from agentrl.rewards.specs import find_reward, resolve_rewards
from agentrl.testing import build_tiny_model, make_trajectory


def save(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def small(tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=1,
        pad_token_id=2,
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """A reward model, a process reward model, a causal LM and a folder with no model."""
    root = tmp_path_factory.mktemp("forms")
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("no model here")
    return {
        "rm": save(LlamaForSequenceClassification(small(tokenizer)), tokenizer, root / "tiny_rm"),
        "prm": save(LlamaForTokenClassification(small(tokenizer)), tokenizer, root / "tiny_prm"),
        "lm": save(build_tiny_model(len(tokenizer)), tokenizer, root / "tiny_lm"),
        "empty": root / "empty",
        "root": root,
    }


class ThirdParty:
    """A third-party plugin: ``api:`` declares its argument's form; ``bundle:`` takes a bare folder
    holding a ``bundle.json`` (a predicate, not a model role)."""

    @hookimpl
    def agentrl_register_reward_schemes(self, register):
        register("api", lambda argument, context: None, argument="ENDPOINT_NAME")
        register(
            "bundle",
            lambda argument, context: lambda trajectories: [float(len(argument))] * len(trajectories),
            path_argument=True,
            argument="BUNDLE_DIR",
            takes_folder=lambda folder: (Path(folder) / "bundle.json").is_file(),
            bare_folder=True,
        )


@pytest.fixture
def registry():
    manager = load_plugins()
    manager.register_plugin(ThirdParty(), name="third_party")
    return manager.registry


def one_line_error(name: str, registry, error: type[Exception] = ConfigError) -> str:
    with pytest.raises(error) as caught:
        find_reward(name, registry)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_unknown_reward_names_it_every_installed_reward_every_scheme_and_the_function_forms(registry):
    message = one_line_error("./tiny_rm", registry, PluginError)
    assert message.startswith("unknown reward './tiny_rm'; Installed: accuracy, format, tool_use.")
    assert "No folder './tiny_rm' exists either." in message
    for form in (
        "rm:MODEL_DIR",
        "prm:MODEL_DIR",
        "judge:policy|openai|MODEL_DIR|MODEL_ALIAS",
        "api:ENDPOINT_NAME",  # a third party's scheme, with the form it declared
        "bundle:BUNDLE_DIR",
        "a folder holding a sequence-classification model (used as rm:)",
        "path/file.py:func",
        "module:func",
        "optional :WEIGHT",
    ):
        assert form in message, form
    close = one_line_error("acuracy", registry, PluginError)
    assert close.startswith("unknown reward 'acuracy'; did you mean 'accuracy'?") and "rm:MODEL_DIR" in close
    assert "No folder" not in close  # not written as a path


def test_a_missing_file_and_a_module_that_fails_to_import_keep_their_own_lines(registry, tmp_path, monkeypatch):
    (tmp_path / "broken_rewards.py").write_text("import no_such_dependency_here\n")
    (tmp_path / "good_rewards.py").write_text("def score(trajectories):\n    return [1.0] * len(trajectories)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert one_line_error("missing_file.py:score", registry) == (
        "reward 'missing_file.py:score': file 'missing_file.py' does not exist"
    )
    assert one_line_error("broken_rewards:score", registry) == (
        "reward 'broken_rewards:score': module 'broken_rewards' failed to import: "
        "ModuleNotFoundError(\"No module named 'no_such_dependency_here'\")"
    )
    assert one_line_error("broken_rewards.py:score", registry).startswith(
        "reward 'broken_rewards.py:score': 'broken_rewards.py' failed to import: ModuleNotFoundError("
    )
    assert one_line_error("good_rewards:nothing", registry) == (
        "reward 'good_rewards:nothing': 'good_rewards' has no 'nothing'; it defines: score"
    )
    unknown = one_line_error("no_such_module:score", registry)
    assert (
        "'no_such_module' is neither a reward scheme (api, bundle, judge, prm, rm) nor an importable module" in unknown
    )
    assert "rm:MODEL_DIR" in unknown and "path/file.py:func" in unknown
    assert find_reward("good_rewards.py:score", registry)[1] == "agentrl"


def test_a_bare_reward_model_folder_is_used_as_rm_with_its_absolute_path(folders, registry, monkeypatch, capsys):
    monkeypatch.chdir(folders["root"])
    monkeypatch.setattr(schemes, "_NOTED", set())
    want = f"rm:{folders['rm']}"
    assert bare_folder("./tiny_rm", registry) == want
    assert canonical_reward("tiny_rm", registry) == want  # no ./ needed
    assert bare_folder(str(folders["rm"]), registry) == want
    assert find_reward("./tiny_rm", registry)[1] == "scheme"
    config = with_absolute_paths(TrainConfig(rewards={"./tiny_rm": 0.5, "format": 0.2}), registry)
    assert config.rewards == {want: 0.5, "format": 0.2}
    notes = capsys.readouterr().err.splitlines()
    assert f"note: reward './tiny_rm' is a folder holding a sequence-classification model: used as {want}" in notes
    assert sum("'./tiny_rm'" in line for line in notes) == 1  # said once, however often it is resolved


def test_resolving_a_bare_folder_builds_the_reward_model_labelled_rm(folders, registry, monkeypatch):
    from agentrl_math import MathEnv

    monkeypatch.chdir(folders["root"])
    config = TrainConfig(rewards={"tiny_rm": 1.0})
    context = RewardContext(config=config, settings={})
    resolved = resolve_rewards(config, registry, MathEnv(), context)
    assert list(resolved) == ["rm"]
    episode = make_trajectory(
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], {"answer": "4"}
    )
    (score,) = resolved["rm"][0]([episode])
    assert isinstance(score, float) and score == score  # a real forward pass, finite


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        (
            "lm",
            "reward '{path}' is a folder holding a causal LM (LlamaForCausalLM); a bare folder is used only when it "
            "holds what bundle: takes (as bundle:) or a sequence-classification model (as rm:): use judge:{path}",
        ),
        (
            "prm",
            "reward '{path}' is a folder holding a token-classification model (LlamaForTokenClassification); a bare "
            "folder is used only when it holds what bundle: takes (as bundle:) or a sequence-classification model "
            "(as rm:): use prm:{path}",
        ),
        (
            "empty",
            "reward '{path}' is a folder holding no model (no config.json), which no reward scheme takes; a bare "
            "folder is used only when it holds what bundle: takes (as bundle:) or a sequence-classification model "
            "(as rm:); the schemes: api:ENDPOINT_NAME, bundle:BUNDLE_DIR, judge:policy|openai|MODEL_DIR|MODEL_ALIAS, "
            "prm:MODEL_DIR, rm:MODEL_DIR",
        ),
    ],
)
def test_a_bare_folder_holding_another_model_names_the_scheme_that_takes_it(folders, registry, folder, message):
    path = str(folders[folder])
    assert one_line_error(path, registry) == message.format(path=path)
    with pytest.raises(ConfigError, match=re.escape(message.format(path=path))):
        with_absolute_paths(TrainConfig(rewards={path: 1.0}), registry)


def test_a_third_party_scheme_takes_bare_folders_through_its_own_predicate(registry, tmp_path, monkeypatch):
    (tmp_path / "my_bundle").mkdir()
    (tmp_path / "my_bundle" / "bundle.json").write_text(json.dumps({"kind": "bundle"}))
    monkeypatch.chdir(tmp_path)
    assert canonical_reward("my_bundle", registry) == f"bundle:{tmp_path / 'my_bundle'}"
    config = TrainConfig(rewards={"my_bundle": 1.0})
    from agentrl_math import MathEnv

    resolved = resolve_rewards(config, registry, MathEnv(), RewardContext(config=config, settings={}))
    assert list(resolved) == ["bundle"]


def test_an_installed_name_and_a_model_alias_win_over_a_folder_of_that_name(registry, tmp_path, monkeypatch):
    for name in ("format", "smollm2-135m"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    assert bare_folder("format", registry) is None and find_reward("format", registry)[1] == "agentrl"
    assert canonical_reward("judge:smollm2-135m", registry) == "judge:smollm2-135m"  # the alias, not ./smollm2-135m
    assert canonical_reward("judge:policy", registry) == "judge:policy"


def test_the_forms_table_in_the_guide_names_every_scheme_form(registry):
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "rewards.md").read_text()
    table = guide[guide.index("| `--reward` takes") :].split("\n\n")[0]
    for form in schemes.scheme_forms(load_plugins().registry):
        assert f"`{form.split(':')[0]}:" in table, form
    for form in ("NAME:WEIGHT", "path/file.py:func", "module:func", "./my_rm", "judge:smollm2-135m"):
        assert form in table, form
    assert table.count("\n|") >= 9  # a row per form, under the header and its rule
