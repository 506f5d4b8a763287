"""The default model's conversion into the cache dir (once, also when two runs start at once), and every
model folder checked for the role it plays before it loads."""

from __future__ import annotations

import errno
import fcntl
import json
import re
import threading
from pathlib import Path

import pytest
import safetensors
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from agentrl.errors import ConfigError, ModelError
from agentrl.model.loading import DEFAULT_MODEL, load_model, load_tokenizer, resolve_model
from agentrl.model.roles import (
    CAUSAL,
    ROLES,
    TOKEN,
    ModelFolderError,
    architecture_kind,
    head_keys,
    load_for_role,
    load_tokenizer_for_role,
)

VOCAB = 49152  # the default model's tokenizer's (the tokenizer fixture is saved with each folder)


def test_a_second_run_waits_for_the_first_conversion_and_reuses_it(tmp_path: Path, monkeypatch) -> None:
    """While another process holds the conversion lock, resolving the alias waits; once the folder is
    complete it returns it without converting again (no download, no rewrite of a folder in use)."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"
    folder.parent.mkdir(parents=True)
    resolved: list[str] = []
    with open(folder.parent / ".smollm2-135m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "the first run", mid-conversion
        waiter = threading.Thread(target=lambda: resolved.append(resolve_model("smollm2-135m")), daemon=True)
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive() and not resolved  # waiting, not converting beside the first run
        folder.mkdir()
        for name in ("config.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")  # the first run's finished folder (contents not read here)
    waiter.join(timeout=30)
    assert resolved == [str(folder)]
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "tokenizer_config.json"]  # reused as is


def test_a_cache_on_a_filesystem_without_flock_still_resolves(tmp_path: Path, monkeypatch) -> None:
    """Where ``flock`` fails (ENOLCK: some network filesystems) resolving goes on unlocked, as before."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m"

    def no_flock(fd, operation):  # the filesystem refuses the lock; another run's conversion has just ended
        folder.mkdir(parents=True)
        for name in ("config.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    assert resolve_model("smollm2-135m") == str(folder)


# Every model folder a run names is checked for its role before training (agentrl.model.roles).


def _config(**changes) -> LlamaConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaConfig(**{**base, **changes})


def _save(folder: Path, model, tokenizer) -> Path:
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def _edit_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _causal_lm_labelled_1(tmp: Path, tokenizer) -> Path:
    return _edit_config(_save(tmp, LlamaForCausalLM(_config()), tokenizer), num_labels=1, id2label={"0": "LABEL_0"})


def _no_weights(tmp: Path, tokenizer) -> Path:
    folder = _save(tmp, LlamaForSequenceClassification(_config(num_labels=1)), tokenizer)
    (folder / "model.safetensors").unlink()
    return folder


def _broken_config(tmp: Path, tokenizer) -> Path:
    folder = _save(tmp, LlamaForSequenceClassification(_config(num_labels=1)), tokenizer)
    (folder / "config.json").write_text('{"model_type": "llama", "num_labels": 1,')  # cut off mid-write
    return folder


def _wrong_head_size(tmp: Path, tokenizer) -> Path:
    """A two-output head saved, its config then edited to one label: the saved head has 2 rows."""
    folder = _save(tmp, LlamaForSequenceClassification(_config(num_labels=2)), tokenizer)
    return _edit_config(folder, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})


def _sequence_classifier(tmp: Path, tokenizer) -> Path:
    return _save(tmp, LlamaForSequenceClassification(_config(num_labels=1)), tokenizer)


def _missing_layer(tmp: Path, tokenizer) -> Path:
    """A causal LM whose config promises a third layer its weights do not hold."""
    return _edit_config(_save(tmp, LlamaForCausalLM(_config()), tokenizer), num_hidden_layers=3)


def _no_architecture_causal_lm(tmp: Path, tokenizer) -> Path:
    """A causal LM whose config names no architecture: only the loading report shows the missing head."""
    return _edit_config(_causal_lm_labelled_1(tmp, tokenizer), architectures=None)


def _bad_tokenizer(tmp: Path, tokenizer) -> Path:
    folder = _sequence_classifier(tmp, tokenizer)
    (folder / "tokenizer.json").write_text("not json")
    return folder


BAD_FOLDERS = {
    "causal LM with num_labels 1 as rm": (
        "rm",
        _causal_lm_labelled_1,
        "is a causal LM (LlamaForCausalLM) with no trained score head: score.weight would be freshly initialised; "
        "give a sequence-classification reward model (AutoModelForSequenceClassification, num_labels 1)",
    ),
    "no weights": ("rm", _no_weights, "has no weights (no model.safetensors or pytorch_model.bin)"),
    "broken config.json": ("rm", _broken_config, "has a broken config.json (not JSON: "),
    "no tokenizer": ("rm", lambda tmp, tok: _sequence_classifier(tmp, None), "has no tokenizer (no tokenizer.json"),
    "a tokenizer that does not load": ("rm", _bad_tokenizer, "has a tokenizer that could not be loaded: "),
    "wrong head size": (
        "rm",
        _wrong_head_size,
        "has a head of the wrong size: score.weight is [2, 32] in the checkpoint but [1, 32] for its config",
    ),
    "sequence classifier as judge": (
        "judge",
        _sequence_classifier,
        "is a sequence-classification model (LlamaForSequenceClassification), not a causal LM: judge:PATH takes",
    ),
    "sequence classifier as policy": ("policy", _sequence_classifier, "is a sequence-classification model"),
    "policy with missing weights": (
        "policy",
        _missing_layer,
        "lacks trained weights for model.layers.2.input_layernorm.weight, model.layers.2.mlp.down_proj.weight, "
        "model.layers.2.mlp.gate_proj.weight and 6 more: they would be freshly initialised (random)",
    ),
    "causal LM without architectures as rm": (
        "rm",
        _no_architecture_causal_lm,
        "lacks trained weights for score.weight: they would be freshly initialised (random)",
    ),
    "sequence classifier as prm": ("prm", _sequence_classifier, "not a token-classification model"),
    "missing folder": ("rm", lambda tmp, tok: tmp / "nothing-here", "does not exist; give a sequence-classification"),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_a_bad_model_folder_is_one_line_naming_the_role_the_folder_and_the_problem(case, tmp_path, tokenizer):
    role, build, problem = BAD_FOLDERS[case]
    folder = build(tmp_path / "model", tokenizer)
    with pytest.raises(ModelFolderError) as caught:
        load_for_role(role, folder)
        load_tokenizer_for_role(role, folder)
    message = str(caught.value)
    assert message.startswith(f"{role}: {folder} ") and problem in message, message
    assert "\n" not in message


def test_the_policy_loaders_check_the_folder(tmp_path, tokenizer):
    """``--model`` goes through the same checks: the tokenizer's loader reads the folder first (no
    weights loaded), the model's refuses a weight transformers would initialise afresh."""
    head = _sequence_classifier(tmp_path / "classifier", tokenizer)
    with pytest.raises(ModelError, match=re.escape(f"policy: {head} is a sequence-classification model")):
        load_tokenizer(str(head))
    gap = _missing_layer(tmp_path / "gap", tokenizer)
    assert load_tokenizer(str(gap)).pad_token_id is not None  # the folder's files are all there
    with pytest.raises(ModelError, match=re.escape(f"policy: {gap} lacks trained weights for model.layers.2.")):
        load_model(str(gap))


def test_complete_folders_load_for_their_roles(tmp_path, tokenizer, tiny_model_dir):
    """A tied causal LM (no lm_head.weight saved) is complete; so are the default model and a one-label
    classifier with its tokenizer."""
    assert not (set(safetensors.safe_open(str(tiny_model_dir / "model.safetensors"), "pt").keys()) & {"lm_head.weight"})
    assert load_model(str(tiny_model_dir)).config.tie_word_embeddings
    assert load_model(DEFAULT_MODEL).config.model_type == "llama"
    rm = _sequence_classifier(tmp_path / "rm", tokenizer)
    assert load_for_role("rm", rm).config.num_labels == 1 and load_tokenizer_for_role("rm", rm) is not None
    assert head_keys(ROLES["rm"], load_for_role("rm", rm).config) == ["score.weight"]


def test_a_role_error_is_a_config_error_and_a_model_error():
    assert issubclass(ModelFolderError, ConfigError) and issubclass(ModelFolderError, ModelError)
    assert architecture_kind("Qwen2ForTokenClassification") == TOKEN and architecture_kind("LlamaModel") is None
    assert architecture_kind("GPT2LMHeadModel") == CAUSAL == architecture_kind("Gemma3ForConditionalGeneration")


def test_cli_a_policy_with_missing_weights_is_refused_in_one_line(tmp_path, tokenizer):
    from cli_in_process import agentrl_in_process

    gap = _missing_layer(tmp_path / "gap", tokenizer)
    result = agentrl_in_process(
        "train", "--model", str(gap), "--max-steps", "1", "--output-dir", str(tmp_path / "run"), "--set", "eval_tasks=0"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    err = " ".join(result.stderr.split())
    assert f"error: policy: {gap} lacks trained weights for model.layers.2." in err and "Traceback" not in err
