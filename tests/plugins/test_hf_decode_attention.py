"""The hf engine's decode attention (one query position over grouped KV heads, by matmul) against an
independent float64 computation, its hand-over to sdpa, and where the engine switches it on."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl_hf_engine import HFEngine
from agentrl_hf_engine.decode_attention import NAME, decode_attention, use_decode_attention


class Layer(torch.nn.Module):
    """What an attention function reads from its module."""

    is_causal = True

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


def reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor, scale: float):
    """Float64, head by head: query head h reads KV head h // (Hq / Hk); masked positions excluded."""
    rows, heads, _, _ = query.shape
    per_kv = heads // key.shape[1]
    out = torch.zeros(rows, 1, heads, query.shape[-1], dtype=torch.float64)
    for b in range(rows):
        for h in range(heads):
            k, v = key[b, h // per_kv].double(), value[b, h // per_kv].double()  # (L, D)
            scores = (k @ query[b, h, 0].double()) * scale  # (L,)
            scores[~keep[b]] = float("-inf")
            out[b, 0, h] = scores.softmax(-1) @ v
    return out


def inputs(dtype: torch.dtype, heads: int = 6, kv_heads: int = 2, rows: int = 3, length: int = 11):
    """A decode step's query, views of a cache with spare room, and which positions each row keeps."""
    generator = torch.Generator().manual_seed(0)
    query = (2 * torch.randn(rows, heads, 1, 8, generator=generator)).to(dtype)
    store = torch.randn(2, rows, kv_heads, length + 5, 8, generator=generator).to(dtype)
    keep = torch.ones(rows, length, dtype=torch.bool)
    keep[1, :4] = False  # left padding
    keep[2, :2] = False
    return query, store[0, :, :, :length], store[1, :, :, :length], keep


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4)])
def test_matches_float64_reference(mask_kind: str, heads: int, kv_heads: int) -> None:
    query, key, value, keep = inputs(torch.float32, heads, kv_heads)
    if mask_kind == "none":
        keep[:] = True
    mask = {
        "bool": keep[:, None, None, :],
        "additive": torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)[:, None, None, :],
        "none": None,
    }[mask_kind]
    out, weights = decode_attention(Layer(heads // kv_heads), query, key, value, mask, scaling=0.3)
    assert weights is None and out.shape == (3, 1, heads, 8) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(query, key, value, keep, 0.3), atol=1e-6, rtol=0)


def test_bf16_inputs_are_computed_in_float32() -> None:
    query, key, value, keep = inputs(torch.bfloat16)
    out, _ = decode_attention(Layer(3), query, key, value, keep[:, None, None, :])
    assert out.dtype == torch.bfloat16
    exact = reference(query, key, value, keep, 8**-0.5)  # the default scale: 1 / sqrt(head dim)
    # only the output is rounded to bf16: within half a bf16 step of each value (|values| < 4)
    assert (out.double() - exact).abs().max() <= 2**-7


def test_other_calls_go_to_sdpa_unchanged() -> None:
    query, key, value, keep = inputs(torch.float32)
    layer, mask = Layer(3), keep[:, None, None, :]
    prefill = torch.randn(3, 6, 4, 8)  # four query positions
    wide_mask = torch.ones(3, 1, 4, 11, dtype=torch.bool)
    assert torch.equal(
        decode_attention(layer, prefill, key, value, wide_mask)[0],
        sdpa_attention_forward(layer, prefill, key, value, wide_mask)[0],
    )
    for extra in ({"dropout": 0.1}, {"position_bias": torch.zeros(1, 6, 1, 11)}):
        torch.manual_seed(0)
        ours = decode_attention(layer, query, key, value, mask, **extra)[0]
        torch.manual_seed(0)
        assert torch.equal(ours, sdpa_attention_forward(layer, query, key, value, mask, **extra)[0])


def tiny(implementation: str = "sdpa") -> LlamaForCausalLM:
    """A tiny random Llama with grouped KV heads (4 query heads over 2), in ``implementation``."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=implementation,
    )
    return LlamaForCausalLM(config).eval()


def test_only_sdpa_models_switch() -> None:
    assert use_decode_attention(tiny()) and not use_decode_attention(tiny("eager"))
    assert not use_decode_attention(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("dtype", ["bfloat16_weights", "bfloat16", "float32"])
def test_engine_switches_its_own_copy_only(dtype: str) -> None:
    model = tiny()
    engine = HFEngine(model, config=TrainConfig(engine_args={"dtype": dtype}))
    assert model.config._attn_implementation == "sdpa"  # the trainer's model is never switched
    assert (engine.model.config._attn_implementation == NAME) == (dtype != "float32")


def test_engine_samples_as_with_sdpa() -> None:
    """float32 compute (the bf16-rounded weights): the same tokens as sdpa, logprobs to rounding."""
    engine = HFEngine(tiny(), config=TrainConfig(engine_args={"dtype": "bfloat16_weights"}))
    prompts = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 40, 41]]
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, prompt_seeds=(0, 1, 2, 3))
    ours = engine.generate(prompts, sampling)
    engine.model.set_attn_implementation("sdpa")
    theirs = engine.generate(prompts, sampling)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
