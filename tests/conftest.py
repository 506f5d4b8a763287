"""Shared fixtures: the real SmolLM2 tokenizer and a tiny random model built in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentrl.models import DEFAULT_MODEL, load_tokenizer
from agentrl.testing import build_tiny_model


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's real tokenizer and chat template (converted once into the cache)."""
    return load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved tiny model + the real tokenizer: usable anywhere ``--model`` is."""
    folder = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
