"""Shared fixtures: the real SmolLM2 tokenizer and a tiny random model built in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.models import DEFAULT_MODEL, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's real tokenizer and chat template (converted once into the cache)."""
    return load_tokenizer(DEFAULT_MODEL)


def build_tiny_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with the real vocabulary: fast, random, tied embeddings like SmolLM2."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved tiny model + the real tokenizer: usable anywhere ``--model`` is."""
    folder = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
