"""The ``hf`` engine's prefix cache (``engine_args.prefix_cache_mb``): a cached engine samples the
uncached engine's tokens with its logprobs (fp32: to float rounding; bf16: within the bf16 parity
tolerance) on real multi-turn env rollouts, an agent program and a GRPO group; a weight sync never
serves a stale prefix; the hit and prefill counts are what the prompts share; the budget evicts."""

from __future__ import annotations

import pytest
import torch
from test_hf_engine import PROMPTS, make_engine, tiny_model

from agentrl import ConfigError, SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.plugins import load_plugins
from agentrl.testing import build_tiny_model
from agentrl.training.build import make_env
from agentrl_hf_engine.prefix_cache import PrefixCache

AGENT = """
def solve(task, client):
    messages = [{"role": "system", "content": "Be brief. " * 40}, {"role": "user", "content": task["question"]}]
    for _ in range(3):
        reply = client.chat.completions.create(model="m", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": "Go on."})
    return messages[:-1]
"""


def same_generations(cached, uncached, atol: float = 1e-5) -> None:
    """Identical token ids and finish reasons; logprobs within ``atol``."""
    for a, b in zip(cached, uncached, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=atol, rtol=0)


def same_trajectories(cached, uncached) -> None:
    """Identical ids, loss masks and messages; sampler logprobs within fp32 rounding."""
    for a, b in zip(cached, uncached, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and a.messages == b.messages
        torch.testing.assert_close(
            torch.tensor(a.sampler_logprobs), torch.tensor(b.sampler_logprobs), atol=1e-5, rtol=0
        )


def engines(tokenizer, **args):
    """An uncached and a cached fp32 hf engine over one tiny model (the tokenizer's vocabulary)."""
    factory = load_plugins().registry.get("engine", "hf").factory
    model = build_tiny_model(len(tokenizer))
    made = [
        factory(model=model, tokenizer=tokenizer, config=TrainConfig(engine_args={"dtype": "float32", **extra}))
        for extra in ({"prefix_cache_mb": 0}, {"prefix_cache_mb": 256, **args})
    ]
    return made[0], made[1]


def next_turns(prompts: list[list[int]], generations, tail: list[int]) -> list[list[int]]:
    """Each prompt, its completion and ``tail`` (the next turn's template and user text)."""
    return [p + g.token_ids + tail for p, g in zip(prompts, generations)]


def test_later_turns_sample_the_uncached_tokens_and_count_the_first_turn_as_hits() -> None:
    model = tiny_model()
    cached, plain = make_engine(model, prefix_cache_mb=64), make_engine(model, prefix_cache_mb=0)
    sampling = SamplingParams(max_new_tokens=12, temperature=0.9, seed=3)
    first = cached.generate(PROMPTS, sampling)
    same_generations(first, plain.generate(PROMPTS, sampling))
    assert cached.counts() == {
        "engine/prefix_hit_tokens": 0.0,
        "engine/prefilled_tokens": float(sum(map(len, PROMPTS))),
    }
    second = next_turns(PROMPTS, first, [7, 8, 9])
    same_generations(cached.generate(second, sampling), plain.generate(second, sampling))
    # every token of turn one but its last sampled one (never fed, so it has no KV) is a hit
    hits = sum(len(p) + len(g.token_ids) - 1 for p, g in zip(PROMPTS, first))
    assert cached.counts() == {
        "engine/prefix_hit_tokens": float(hits),
        "engine/prefilled_tokens": float(sum(map(len, second)) - hits),
    }
    assert plain.counts() == {}  # off: no engine metrics, the run's metrics are as they were


def test_a_grpo_group_is_prefilled_once_and_its_next_call_prefills_one_token() -> None:
    model = tiny_model()
    cached, plain = make_engine(model, prefix_cache_mb=64), make_engine(model, prefix_cache_mb=0)
    group = [[1, 3, 4, 5, 6, 7, 8, 9, 10, 11]] * 8
    for seed in (5, 6):  # the second call's prompt is wholly cached but its last token
        sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed)
        same_generations(cached.generate(group, sampling), plain.generate(group, sampling))
    metrics = cached.counts()
    assert metrics == {"engine/prefix_hit_tokens": 9.0, "engine/prefilled_tokens": 10.0 + 1.0}


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat16_weights"])
def test_low_precision_cached_turns_stay_within_the_parity_tolerance(dtype: str) -> None:
    model = tiny_model()
    cached, plain = (
        make_engine(model, dtype=dtype, prefix_cache_mb=64),
        make_engine(model, dtype=dtype, prefix_cache_mb=0),
    )
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    first = plain.generate(PROMPTS, sampling)
    cached.generate(PROMPTS, sampling)
    second = next_turns(PROMPTS, first, [7, 8, 9])
    atol = 0.1 if dtype == "bfloat16" else 1e-5  # bf16: the bf16 engine's own parity tolerance
    for a, b in zip(cached.generate(second, sampling), plain.generate(second, sampling)):
        k = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
        assert k >= 1  # greedy ties can flip under bf16 rounding; compare up to the first flip
        torch.testing.assert_close(torch.tensor(a.logprobs[:k]), torch.tensor(b.logprobs[:k]), atol=atol, rtol=0)
    assert cached.counts()["engine/prefix_hit_tokens"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_weight_sync_between_turns_never_serves_the_old_weights_prefix(dtype: str) -> None:
    model, newer = tiny_model(seed=0), tiny_model(seed=1)
    cached = make_engine(model, dtype=dtype, prefix_cache_mb=64)
    sampling = SamplingParams(max_new_tokens=8, temperature=0.8, seed=2)
    first = cached.generate(PROMPTS, sampling)
    with torch.no_grad():  # the optimizer's in-place update of the trainer's model, then the sync
        for p, q in zip(model.parameters(), newer.parameters()):
            p.copy_(q)
    cached.sync_weights(model)
    cached.counts()
    second = next_turns(PROMPTS, first, [7, 8, 9])
    fresh = make_engine(newer, dtype=dtype, prefix_cache_mb=0)  # an uncached engine with the new weights
    same_generations(cached.generate(second, sampling), fresh.generate(second, sampling))
    assert cached.counts()["engine/prefix_hit_tokens"] == 0.0


def test_a_new_version_before_a_decode_step_clears_the_cache() -> None:
    model = tiny_model()
    cached = make_engine(model, prefix_cache_mb=64)
    versions = iter([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    cached.before_decode_step = lambda: next(versions)
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = cached.generate(PROMPTS[:1], sampling)
    assert cached.prefix_cache.version == 1 and cached.prefix_cache.sequences()  # stored after the change
    cached.before_decode_step = lambda: 2  # another version: the entries are stale
    cached.generate(next_turns(PROMPTS[:1], first, [7]), sampling)
    metrics = cached.counts()
    assert metrics["engine/prefix_hit_tokens"] == 0.0


def env_rollouts(engine, tokenizer, env_name: str, indices: list[int]) -> list:
    """``multi_turn`` rollouts of training tasks ``indices`` of ``env_name`` on ``engine``, one env each
    (indexed: the training split is lazy, a million tasks long)."""
    plugins = load_plugins()
    config = TrainConfig(env=env_name, max_new_tokens=8)
    rollout = plugins.registry.get("rollout", "multi_turn").factory(engine=engine, tokenizer=tokenizer, config=config)
    envs = [make_env(plugins, config) for _ in indices]
    tasks = [dict(envs[0].train_tasks()[i]) for i in indices]
    return rollout.run(envs, tasks, list(range(len(indices))), SamplingParams(max_new_tokens=8, seed=4))


def test_multi_turn_env_rollouts_are_the_uncached_ones(tokenizer) -> None:
    """``guess`` runs several turns, twice on unchanged weights (two steps whose update left the
    policy alone: the second hits what the first left); ``calculator`` (one turn for a model that
    calls no tool) runs one task, then another that shares its instructions and worked examples."""
    plain, cached = engines(tokenizer)
    for _ in range(2):
        guesses = [env_rollouts(engine, tokenizer, "guess", [0, 1]) for engine in (cached, plain)]
        same_trajectories(*guesses)
        assert min(len(t.turns) for t in guesses[0]) >= 2
    assert cached.counts()["engine/prefix_hit_tokens"] > 0
    for index in (0, 1):
        cached.counts()  # the hits of this call alone (the first shares the chat template's opening)
        calc = [env_rollouts(engine, tokenizer, "calculator", [index]) for engine in (cached, plain)]
        same_trajectories(*calc)
        if index == 0:
            earlier = calc[0][0].token_ids
    later = calc[0][0].token_ids
    shared = next(i for i, (x, y) in enumerate(zip(earlier, later)) if x != y)  # up to the second question
    assert shared > len(later) // 2  # the instructions and worked examples, then a question of its own
    assert cached.counts()["engine/prefix_hit_tokens"] == float(shared)


def test_an_agent_programs_calls_are_the_uncached_ones(tokenizer, tmp_path) -> None:
    plain, cached = engines(tokenizer)
    path = tmp_path / "agent.py"
    path.write_text("import openai\n" + AGENT)
    plugins = load_plugins()
    runs = []
    for engine in (plain, cached):
        config = TrainConfig(max_new_tokens=6, plugins={"openai_agent": {"agent": f"{path}:solve"}})
        rollout = plugins.registry.get("rollout", "openai_agent").factory(
            engine=engine, tokenizer=tokenizer, config=config
        )
        tasks = [{"question": f"What is {i} + 1?"} for i in range(2)]
        runs.append(rollout.run([None] * 2, tasks, [0, 1], SamplingParams(max_new_tokens=6, seed=3)))
    same_trajectories(runs[1], runs[0])
    metrics = cached.counts()
    assert metrics["engine/prefix_hit_tokens"] > metrics["engine/prefilled_tokens"]  # the system prompt, again


def kv_of(ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One layer's keys and values (2 heads, 8 dims, keys and values: 128 bytes a token) that say which id they hold."""
    keys = torch.tensor(ids, dtype=torch.float32)[None, :, None].expand(2, len(ids), 8)
    return [(keys, -keys)]


def test_a_shared_prefix_is_held_once_and_a_hit_returns_its_own_kv() -> None:
    cache = PrefixCache(budget=10_000)
    cache.store([1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    cache.store([1, 2, 3, 4, 5, 6], kv_of([1, 2, 3, 4, 5, 6]))  # extends: only 5, 6 are added
    cache.store([1, 2, 7], kv_of([1, 2, 7]))  # splits the path after 1, 2
    cache.store([1, 2], kv_of([1, 2]))  # already held: nothing added
    assert cache.nbytes == 7 * 128  # ids 1 2 3 4 5 6 7, once each
    assert sorted(cache.sequences()) == [(1, 2, 3, 4, 5, 6), (1, 2, 7)]
    for prompt, held in [([1, 2, 3, 4, 5, 6, 9], 6), ([1, 2, 7, 8], 3), ([1, 2, 3, 9], 3), ([1, 2, 3], 2), ([5], 0)]:
        length, kv = cache.lookup(prompt)
        assert length == held  # the last prompt id is always left to prefill
        if held:
            keys, values = kv[0]
            assert keys.shape == (2, held, 8)
            assert torch.equal(keys[0, :, 0], torch.tensor(prompt[:held], dtype=torch.float32))
            assert torch.equal(values, -keys)
        else:
            assert kv is None


def test_the_budget_evicts_least_recently_used_leaves() -> None:
    cache = PrefixCache(budget=10 * 128)
    cache.store([1, 2, 3, 4], kv_of([1, 2, 3, 4]))
    cache.store([5, 6, 7, 8], kv_of([5, 6, 7, 8]))
    assert cache.lookup([1, 2, 3, 4, 9])[0] == 4  # touched: [5..8] is now the oldest
    cache.store([9, 9, 9], kv_of([9, 9, 9]))  # 11 tokens held: [5..8] goes
    assert cache.nbytes == 7 * 128 and cache.lookup([5, 6, 7, 8, 1])[0] == 0
    cache.store([1, 2, 3, 4, 5, 6, 7], kv_of([1, 2, 3, 4, 5, 6, 7]))  # extends [1..4]: 10 held
    assert cache.nbytes == 10 * 128 and len(cache.sequences()) == 2
    cache.store([1, 2, 8], kv_of([1, 2, 8]))  # a new leaf under the split: [9, 9, 9] is the oldest
    assert sorted(cache.sequences()) == [(1, 2, 3, 4, 5, 6, 7), (1, 2, 8)]
    cache.store(list(range(20, 31)), kv_of(list(range(20, 31))))  # more than the budget: not kept
    assert cache.nbytes == 8 * 128 and cache.lookup([20, 21, 22])[0] == 0
    cache.clear(version=3)
    assert cache.nbytes == 0 and cache.sequences() == [] and cache.version == 3


def test_a_bad_budget_is_one_line() -> None:
    with pytest.raises(ConfigError, match="engine_args.prefix_cache_mb"):
        make_engine(tiny_model(), prefix_cache_mb=-1)
