"""The hf engine prefills a call's shared prompt start once (``engine_args.share_prefix_min_tokens``):
the same tokens as prefilling every row whole, logprobs to float rounding, fewer tokens prefilled."""

from __future__ import annotations

import pytest
import torch
from test_hf_engine import make_engine, tiny_model
from test_hf_prefix_cache import same_generations

from agentrl import ConfigError, SamplingParams
from agentrl_hf_engine.prefix_cache import shared_start

SYSTEM = [1, *range(20, 44)]  # 25 ids every prompt begins with
PROMPTS = [
    SYSTEM + [5, 6, 7],
    SYSTEM + [9],  # one id past the shared start: only its last id is prefilled
    SYSTEM + [5, 6, 7],  # a GRPO group's copy of the first
    SYSTEM + [60, 61, 62, 63, 64, 65, 66, 67],
]


def test_shared_start_is_what_every_prompt_begins_with() -> None:
    assert shared_start([(1, 2, 3), (1, 2, 4), (1, 2)]) == (1, 2)
    assert shared_start([(1, 2, 3), (1, 2, 3)]) == (1, 2, 3)
    assert shared_start([(5, 1), (1, 2)]) == ()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_shared_start_prefilled_once_samples_the_whole_prefills_tokens(seed: int) -> None:
    model = tiny_model()
    # the prefix cache only counts tokens here: no call hits it (one call, fresh cache)
    shared = make_engine(model, share_prefix_min_tokens=8, prefix_cache_mb=64)
    whole = make_engine(model, share_prefix_min_tokens=0, prefix_cache_mb=64)
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed)
    same_generations(shared.generate(PROMPTS, sampling), whole.generate(PROMPTS, sampling))
    distinct = [PROMPTS[0], PROMPTS[1], PROMPTS[3]]
    assert whole.counts()["engine/prefilled_tokens"] == float(sum(map(len, distinct)))
    once = len(SYSTEM) + sum(len(p) - len(SYSTEM) for p in distinct)
    assert shared.counts() == {"engine/prefix_hit_tokens": 0.0, "engine/prefilled_tokens": float(once)}


def test_a_shorter_shared_start_than_the_minimum_is_prefilled_per_row() -> None:
    model = tiny_model()
    engine = make_engine(model, share_prefix_min_tokens=len(SYSTEM) + 1, prefix_cache_mb=64)
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert engine.counts()["engine/prefilled_tokens"] == float(sum(map(len, [PROMPTS[0], PROMPTS[1], PROMPTS[3]])))


def test_a_cached_start_is_not_prefilled_again() -> None:
    model = tiny_model()
    shared = make_engine(model, share_prefix_min_tokens=8, prefix_cache_mb=64)
    whole = make_engine(model, share_prefix_min_tokens=0)
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = shared.generate(PROMPTS[:1], sampling)  # stores the first prompt and its completion
    shared.counts()
    later = [PROMPTS[0] + first[0].token_ids + [7, 8], SYSTEM + [70, 71, 72]]
    same_generations(shared.generate(later, sampling), whole.generate(later, sampling))
    hit = len(PROMPTS[0]) + len(first[0].token_ids) - 1
    assert shared.counts() == {  # both rows start from the stored KV: the second from its first 25 ids
        "engine/prefix_hit_tokens": float(hit + len(SYSTEM)),
        "engine/prefilled_tokens": float(len(later[0]) - hit + 3),
    }


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat16_weights"])
def test_low_precision_shared_starts_stay_within_the_parity_tolerance(dtype: str) -> None:
    model = tiny_model()
    shared = make_engine(model, dtype=dtype, share_prefix_min_tokens=8)
    whole = make_engine(model, dtype=dtype, share_prefix_min_tokens=0)
    sampling = SamplingParams(max_new_tokens=8, temperature=0.0)
    atol = 0.1 if dtype == "bfloat16" else 1e-5  # bf16: the bf16 engine's own parity tolerance
    for a, b in zip(shared.generate(PROMPTS, sampling), whole.generate(PROMPTS, sampling), strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
        assert k >= 1  # greedy ties can flip under bf16 rounding; compare up to the first flip
        torch.testing.assert_close(torch.tensor(a.logprobs[:k]), torch.tensor(b.logprobs[:k]), atol=atol, rtol=0)


def test_a_bad_minimum_is_one_line() -> None:
    with pytest.raises(ConfigError, match="engine_args.share_prefix_min_tokens"):
        make_engine(tiny_model(), share_prefix_min_tokens=-1)
