"""Combinations of the run's main choices (docs/reference/capabilities.md) trained together: two
steps of the tiny model in one process, each really training: the policy's trainable weights move
(with LoRA only the adapter's, the base stays bit for bit), every loss is finite, both steps are
logged with the metrics each choice adds, and the engine ends up holding the trained weights as
the learner hands them over (with LoRA, the merged ones)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.config.train import TrainConfig
from agentrl.model import lora
from agentrl.plugins import load_plugins
from agentrl.testing import lockstep_plugins
from agentrl.training.async_rollouts import version_for
from agentrl.training.trainer import Trainer

pytest.importorskip("peft")

PARITY = {"agentrl.testing:parity_reward": 1.0}  # a reward a random tiny model earns about half the time

AGENT = """
def solve(task, client):
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    return float(len(reply.choices[0].message.content) % 2)
"""
"""An agent program of one call, rewarded by the parity of its reply's length (a spread in each group)."""

COMBINATIONS: dict[str, dict[str, Any]] = {
    "gspo-async": {"algo": "gspo", "async_steps": 1},
    "ppo-lora": {"algo": "ppo", "lora": {"r": 4, "alpha": 8}},
    "gspo-lora": {"algo": "gspo", "lora": {"r": 4, "alpha": 8}},
    "async-lora": {"async_steps": 1, "lora": {"r": 4, "alpha": 8}},
    "openai_agent-async": {"rollout": "openai_agent", "async_steps": 1},
}
"""Each test id's settings over :func:`_config`'s (the names match the capability table's entries)."""


def _config(model_dir: Path, tmp_path: Path, settings: dict[str, Any]) -> TrainConfig:
    plugins = lockstep_plugins()
    if settings.get("rollout") == "openai_agent":
        agent = tmp_path / "agent.py"
        agent.write_text(AGENT)
        plugins["openai_agent"] = {"agent": f"{agent}:solve"}
    return TrainConfig(
        **{
            "model": str(model_dir),
            "max_steps": 2,
            "prompts_per_step": 2,
            "num_generations": 3,
            "max_new_tokens": 8,
            "eval_tasks": 0,
            "output_dir": str(tmp_path / "run"),
            "log_completions_every": 0,
            "save_model": False,
            "checkpoint_every": 0,
            "precision": "fp32",
            "engine_args": {"dtype": "float32"},  # the hf engine samples from the handed-over weights themselves
            "learning_rate": 1e-2,
            "rewards": PARITY,
            "plugins": plugins,
            **settings,
        }
    )


def _expected_metrics(settings: dict[str, Any]) -> set[str]:
    keys = {"loss/total", "train/grad_norm", "reward/total_mean"}
    if settings.get("async_steps"):
        keys |= {"async/sampling_version", "async/staleness_max", "mismatch/ratio_mean"}
    if settings.get("algo") in ("gspo", "ppo"):
        keys |= {"clip/region"}
    if settings.get("algo") == "ppo":
        keys |= {"loss/value", "critic/grad_norm", "critic/explained_variance"}
    return keys


@pytest.mark.parametrize("settings", COMBINATIONS.values(), ids=COMBINATIONS.keys())
def test_two_steps_train_the_combination(tiny_model_dir, tmp_path, settings):
    trainer = Trainer(_config(tiny_model_dir, tmp_path, settings), load_plugins())
    model = trainer.model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and (lora.is_adapted(model) == ("lora" in settings))
    if "lora" in settings:
        assert all(".lora_" in name for name in trained)
    modules = trainer.run.trained
    critic = modules["critic"].module if "critic" in modules else None
    critic_before = [p.detach().clone() for p in critic.parameters()] if critic is not None else []

    trainer.train()

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        missing = _expected_metrics(settings) - set(row)
        assert not missing, f"step {row['step']} lacks {sorted(missing)}"
        assert math.isfinite(row["loss/total"]) and row["train/nonfinite_skipped_steps"] == 0
        assert row["train/grad_norm"] > 0
        if settings.get("async_steps"):
            assert row["async/sampling_version"] == version_for(row["step"], settings["async_steps"], 0)
        if settings.get("rollout") == "openai_agent":
            assert row["rollout/turns_mean"] == 1.0  # the agent's one call
    moved = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert moved and moved <= trained, sorted(moved - trained)[:3]  # only what trains moved (LoRA: the base stays)
    if critic is not None:
        assert any(not torch.equal(a, b) for a, b in zip(critic_before, critic.parameters()))
        assert not any(".lora_" in name for name, _ in critic.named_parameters())  # a plain copy of the decoder
    # The engine holds the trained policy as the learner hands it over (LoRA: W + (alpha / r) B A).
    handed = dict(lora.sampling_model(model).named_parameters())
    engine = getattr(trainer.engine, "engine", trainer.engine)  # an asynchronous run's is versioned: its inner one
    sampled = dict(engine.model.named_parameters())
    assert handed.keys() == sampled.keys()
    for name, tensor in handed.items():
        torch.testing.assert_close(sampled[name], tensor, rtol=0, atol=0, msg=name)


@pytest.fixture
def head64_model_dir(tmp_path, tokenizer) -> Path:
    """A tiny random Llama with the real tokenizer, its attention heads 64 wide (what vLLM's CPU
    attention supports) and weights large enough (N(0, 0.1)) that an adapter's update shows in the logprobs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,  # the run's max_total_tokens
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        initializer_range=0.1,
    )
    folder = tmp_path / "head64"
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Float64 full-vocabulary logprobs of ``completion`` after ``prompt`` (temperature 1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_lora_with_the_vllm_engine_samples_the_merged_weights(head64_model_dir, tmp_path):
    """``--engine vllm`` with LoRA: vLLM is built from the merged view and takes it after each update
    (plain names, ``W + (alpha / r) B A``): what it samples after training has the logprobs of the
    trained policy (adapter on), not the base model's."""
    pytest.importorskip("vllm")
    from agentrl import SamplingParams

    settings = {
        "engine": "vllm",
        "lora": {"r": 4, "alpha": 8},
        "engine_args": {"dtype": "float32", "kv_cache_gb": 0.25},
        "learning_rate": 5e-2,
    }
    trainer = Trainer(_config(head64_model_dir, tmp_path, settings), load_plugins())
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and rows[0]["train/grad_norm"] > 0
    assert all(math.isfinite(row["loss/total"]) for row in rows)
    assert abs(rows[1]["policy/sampler_logprob_gap"]) < 1e-3  # step 2 sampled what the trainer scores
    prompt = [1, *range(300, 340)]
    sampled = trainer.engine.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))[0]
    logprobs = torch.tensor(sampled.logprobs, dtype=torch.float64)
    trained = _logprobs(trainer.model, prompt, sampled.token_ids)
    torch.testing.assert_close(logprobs, trained, atol=1e-3, rtol=0)
    with lora.adapter_disabled(trainer.model):
        base = _logprobs(trainer.model, prompt, sampled.token_ids)
    assert float((base - trained).abs().max()) > 1e-2  # the adapter's update shows: a stale engine would fail
