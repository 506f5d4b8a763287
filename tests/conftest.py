"""Shared fixtures: the real SmolLM2 tokenizer and a tiny random model built in-process."""

from __future__ import annotations

import os
from pathlib import Path

# pytest-xdist workers share the cores: each worker (and every process its tests start, which
# inherit the variable) sizes its OpenMP pool to its share, instead of every worker spinning one
# thread per core (on 2 cores with 2 workers that oversubscription cost ~25% of the wall time).
if os.environ.get("PYTEST_XDIST_WORKER"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, _workers))))

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
