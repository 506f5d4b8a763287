"""The ``hf`` engine's KV cache that grows in place: it holds what ``DynamicCache`` holds through
writes, growth, dropped rows and repeats, and the engine on it samples ``DynamicCache``'s tokens and
logprobs (fresh prompts, rows stopping mid-decode, prefix-cache hits, a weight version change)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_hf_engine import PROMPTS, make_engine, tiny_model
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

import agentrl_hf_engine
from agentrl import SamplingParams
from agentrl_hf_engine import HFEngine
from agentrl_hf_engine.kv_cache import GrowingCache, GrowingLayer


class CopyingEngine(HFEngine):
    """The engine as it was: transformers' ``DynamicCache``, grown by ``torch.cat``."""

    def _new_cache(self, reserve: int) -> Any:
        return DynamicCache(config=self.model.config)


def copying_engine(model: torch.nn.Module, **engine_args: object) -> CopyingEngine:
    """A :class:`CopyingEngine` over ``model``, fp32 unless ``dtype`` says otherwise."""
    engine = make_engine(model, **engine_args)
    engine.__class__ = CopyingEngine
    return engine


def same(a_list, b_list, atol: float = 1e-5) -> None:
    """Identical tokens and finish reasons; logprobs within ``atol``."""
    for a, b in zip(a_list, b_list, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=atol, rtol=0)


def kv(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random keys and values (rows, 2 heads, length, 4)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, length, 4, generator=generator), torch.randn(rows, 2, length, 4, generator=generator)


def test_a_growing_layer_holds_what_a_dynamic_layer_holds_through_growth_drops_and_repeats() -> None:
    growing, dynamic = GrowingLayer(reserve=2), DynamicLayer()
    ops: list[tuple[str, Any]] = [("write", (4, 3)), ("write", (4, 1)), ("write", (4, 1)), ("write", (4, 1))]
    ops += [("keep", torch.tensor([3, 0, 2])), ("write", (3, 1)), ("repeat", 2), ("write", (6, 5)), ("crop", -2)]
    ops += [("keep", torch.tensor([5, 5, 1])), ("write", (3, 1))]
    capacities = []
    for seed, (op, arg) in enumerate(ops):
        if op == "write":
            for layer in (growing, dynamic):
                keys, values = layer.update(*kv(*arg, seed))
            torch.testing.assert_close(keys, dynamic.keys, atol=0, rtol=0)
        elif op == "keep":
            growing.batch_select_indices(arg)
            dynamic.batch_select_indices(arg)
        elif op == "repeat":
            growing.batch_repeat_interleave(arg)
            dynamic.batch_repeat_interleave(arg)
        else:
            growing.crop(arg)
            dynamic.crop(arg)
        torch.testing.assert_close(growing.keys, dynamic.keys, atol=0, rtol=0)
        torch.testing.assert_close(growing.values, dynamic.values, atol=0, rtol=0)
        assert growing.get_seq_length() == dynamic.get_seq_length()
        capacities.append(growing.capacity)
    assert capacities[:4] == [5, 5, 5, 10]  # 3 + 2 reserved, then doubled once past it, not per write
    assert max(capacities) > 10  # the 5-position write grew it again
    assert growing.keys.data_ptr() == growing.key_store.data_ptr()  # a view of the buffer, not a copy


def test_a_model_forward_on_the_growing_cache_matches_dynamic_cache_past_its_room() -> None:
    model = tiny_model()
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])
    growing, dynamic = GrowingCache(model.config, reserve=1), DynamicCache(config=model.config)
    with torch.no_grad():
        for start, end in [(0, 3), (3, 4), (4, 5)]:  # the third write passes 3 + 1 reserved positions
            logits = [
                model(input_ids=ids[:, start:end], past_key_values=c, use_cache=True).logits for c in (growing, dynamic)
            ]
            torch.testing.assert_close(logits[0], logits[1], atol=1e-6, rtol=0)
    assert growing.get_seq_length() == 5 and growing.layers[0].capacity == 8


@pytest.mark.parametrize(
    ("sampling", "reserve"),
    [
        (SamplingParams(max_new_tokens=30, temperature=1.0, seed=3), 256),
        (SamplingParams(max_new_tokens=30, temperature=1.0, seed=3), 4),  # grows 3 times mid-decode
        (SamplingParams(max_new_tokens=6, temperature=5.0, seed=0), 256),
    ],
    ids=["ragged", "grown-mid-decode", "rows-stop-mid-decode"],
)
def test_the_engine_samples_dynamic_caches_tokens_and_logprobs(
    sampling: SamplingParams, reserve: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agentrl_hf_engine, "RESERVE", reserve)
    model = tiny_model()
    prompts = PROMPTS if sampling.max_new_tokens == 30 else [[1, i] for i in range(3, 60)]
    ours, theirs = make_engine(model), copying_engine(model)
    caches: list[Any] = []
    new_cache = ours._new_cache
    ours._new_cache = lambda room: caches.append(new_cache(room)) or caches[-1]  # kept to look at after
    same(ours.generate(prompts, sampling), theirs.generate(prompts, sampling))
    layer = caches[0].layers[0]
    assert isinstance(layer, GrowingLayer)
    if reserve == 4:  # 10 prompt + 4 reserved positions, doubled to 28 and 56 for 10 + 29 fed
        assert layer.capacity == 56
    if sampling.max_new_tokens == 6:  # rows left the batch at different steps
        generations = ours.generate(prompts, sampling)
        lengths = {len(g.token_ids) for g in generations if g.finish_reason == "stop"}
        assert len(lengths) > 1 and any(g.finish_reason == "length" for g in generations)


def test_prefix_cache_hits_sample_what_dynamic_cache_samples() -> None:
    model = tiny_model()
    ours, theirs = make_engine(model, prefix_cache_mb=64), copying_engine(model, prefix_cache_mb=64)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1)
    first = [ours.generate(PROMPTS, sampling), theirs.generate(PROMPTS, sampling)]
    same(*first)
    turns = [p + g.token_ids + [40, 41] for p, g in zip(PROMPTS, first[0])]
    second = [ours.generate(turns, sampling), theirs.generate(turns, sampling)]
    same(*second)
    assert ours.counts()["engine/prefix_hit_tokens"] > 0


def test_a_version_change_mid_decode_recomputes_on_a_fresh_growing_cache() -> None:
    model = tiny_model()
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=2)
    results = []
    for engine in (make_engine(model), copying_engine(model)):
        versions = iter([0, 0, 0, 1, 1, 1, 2])
        engine.before_decode_step = lambda versions=versions: next(versions, 2)
        results.append(engine.generate(PROMPTS, sampling))
    same(*results)
    assert {v for g in results[0] for v in g.token_versions} == {0, 1, 2}
