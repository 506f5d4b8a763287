"""A vLLM engine replica as a Ray actor (``--engine vllm`` with ``ray.engines``) on the simulated
cluster's engine node: the tokens of the in-process vLLM engine, and new weights through the
object store reaching it."""

from __future__ import annotations

import pytest
import torch

from agentrl.cluster.engines import RemoteEngines
from agentrl.config.cluster import RayConfig
from agentrl.config.train import TrainConfig
from agentrl.model.loading import load_model
from agentrl.plugins import load_plugins
from agentrl.sampling.engine import SamplingParams

ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 40, 41]]
ENGINE_ARGS = {"kv_cache_gb": 0.25}  # the engines of this run share a 24 GB machine


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory, tokenizer):
    """A random tiny Llama whose head size vLLM's CPU attention takes (64), with the real tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, initializer_range=0.1,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("vllm-tiny")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_vllm_replica_on_the_engine_node_samples_the_in_process_engine_tokens_and_takes_new_weights(
    ray_cluster, vllm_model_dir, tokenizer
):
    config = TrainConfig(model=str(vllm_model_dir), engine="vllm", engine_args=ENGINE_ARGS, max_total_tokens=256)
    ray_config = RayConfig(address=ray_cluster.address, engines=1, engine_resources={"CPU": 1, "engine": 1})
    model = load_model(config.model)
    remote = RemoteEngines(config, ray_config, model, tokenizer)
    local = load_plugins().registry.get("engine", "vllm").factory(model=model, tokenizer=tokenizer, config=config)
    try:
        assert [ray_cluster.name_of(node) for node in remote.replica_nodes()] == ["engine"]
        assert remote.description.startswith("1 vllm replica on Ray")
        sampling = SamplingParams(max_new_tokens=8, temperature=1.0, prompt_seeds=(5, 6, 7, 8))
        assert [g.token_ids for g in remote.generate(PROMPTS, sampling)] == [
            g.token_ids for g in local.generate(PROMPTS, sampling)
        ]
        changed = load_model(config.model)
        with torch.no_grad():
            for p in changed.parameters():
                p.mul_(3.0)  # sharper logits: other tokens
        before = remote.generate(PROMPTS, sampling)
        remote.sync_weights(changed)
        local.sync_weights(changed)
        after = remote.generate(PROMPTS, sampling)
        assert [g.token_ids for g in after] == [g.token_ids for g in local.generate(PROMPTS, sampling)]
        assert [g.token_ids for g in after] != [g.token_ids for g in before]
    finally:
        remote.close()
        getattr(local, "close", lambda: None)()
