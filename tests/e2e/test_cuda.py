"""The engine, the policy head and the trainer on a CUDA GPU (every test skips without one)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl import SamplingParams
from agentrl.config.train import TrainConfig
from agentrl.model.policy import TokenLogprobs
from agentrl.plugins import load_plugins
from agentrl.training.trainer import Trainer
from agentrl_hf_engine import HFEngine, warp_logits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1], [1, 40, 41], [1, 60, 61, 62, 63, 64]]


def cuda_model(seed: int = 0) -> LlamaForCausalLM:
    """A random 2-layer Llama (vocab 128, tied, pad == eos == 2) with peaked logits, on the GPU."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        initializer_range=0.3,
    )
    return LlamaForCausalLM(config).eval().to("cuda")


def engine(model: torch.nn.Module, dtype: str = "float32") -> HFEngine:
    return HFEngine(model=model, tokenizer=None, config=TrainConfig(engine_args={"dtype": dtype}))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=24, temperature=0.7, seed=1),
        SamplingParams(max_new_tokens=24, temperature=0.9, top_k=20, top_p=0.9, seed=4),
        SamplingParams(max_new_tokens=24, temperature=0.0),
    ],
    ids=["T0.7", "topk20-topp0.9", "greedy"],
)
def test_float32_engine_on_cuda_matches_a_separate_forward(sampling: SamplingParams) -> None:
    model = cuda_model()
    eng = engine(model)
    assert eng.device.type == "cuda" and eng.generator.device.type == "cuda"
    for prompt, generation in zip(PROMPTS, eng.generate(PROMPTS, sampling)):
        ids = torch.tensor([prompt + generation.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # (L, V)
        expected = warp_logits(logits, sampling).log_softmax(-1)
        expected = expected.gather(-1, torch.tensor(generation.token_ids, device="cuda")[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected.cpu(), atol=1e-4, rtol=0)


def test_seeded_sampling_on_cuda_reproduces_and_leaves_the_global_rng_alone() -> None:
    eng = engine(cuda_model())
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7)
    state = torch.cuda.get_rng_state()
    first = [g.token_ids for g in eng.generate(PROMPTS, sampling)]
    assert first == [g.token_ids for g in eng.generate(PROMPTS, sampling)]
    other = SamplingParams(max_new_tokens=16, temperature=1.0, seed=8)
    assert first != [g.token_ids for g in eng.generate(PROMPTS, other)]
    assert torch.equal(state, torch.cuda.get_rng_state())


def test_bfloat16_engine_copy_lives_on_cuda_and_follows_sync_weights() -> None:
    model = cuda_model()
    eng = engine(model, "bfloat16")
    params = list(eng.model.parameters())
    assert all(p.device.type == "cuda" and p.dtype == torch.bfloat16 for p in params)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    eng.sync_weights(model)
    for (name, p), copy in zip(model.named_parameters(), eng.model.parameters()):
        torch.testing.assert_close(copy, p.to(torch.bfloat16), atol=0, rtol=0, msg=name)
    assert eng.model.get_output_embeddings().weight is eng.model.get_input_embeddings().weight
    assert all(len(g.token_ids) >= 1 for g in eng.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=0)))


def test_token_logprobs_on_cuda_match_cpu_and_backpropagate() -> None:
    model = cuda_model()
    ids = torch.randint(3, 128, (3, 12), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0
    loss_mask = torch.zeros(3, 12)
    loss_mask[:, 5:9] = 1
    on_gpu, entropy = TokenLogprobs(model)(ids.cuda(), attention.cuda(), loss_mask.cuda())
    on_cpu, _ = TokenLogprobs(model.cpu())(ids, attention, loss_mask)
    model.cuda()
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32 and entropy.device.type == "cuda"
    torch.testing.assert_close(on_gpu.detach().cpu(), on_cpu.detach(), atol=1e-4, rtol=0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        autocast, _ = TokenLogprobs(model)(ids.cuda(), attention.cuda(), loss_mask.cuda())
    assert autocast.dtype == torch.float32 and torch.isfinite(autocast).all()
    autocast.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_trainer_trains_on_cuda_with_a_reference_and_two_iterations(tiny_model_dir, tmp_path) -> None:
    config = TrainConfig(
        model=str(tiny_model_dir),
        max_steps=2,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=4,
        output_dir=str(tmp_path / "run"),
        micro_batch_size=4,
        log_completions_every=1,
        learning_rate=1e-2,
        algorithm={"beta": 0.1, "num_iterations": 2},
        rewards={"parity": 1.0},
    )
    manager = load_plugins()
    # 1 when the first sampled token id is odd: a random tiny model earns it half the time, so advantages vary.
    manager.registry.add(
        "reward",
        "parity",
        lambda trajectories: [float(t.token_ids[t.prompt_length] % 2) for t in trajectories],
        plugin="test",
    )
    trainer = Trainer(config, manager)
    devices = {
        "policy": {p.device.type for p in trainer.model.parameters()},
        "reference": {p.device.type for p in trainer.run.ref_model.parameters()},
        "engine copy": {p.device.type for p in trainer.engine.model.parameters()},
    }
    print(f"\ndevices: {devices}, accelerator {trainer.accelerator.device}")
    assert all(kinds == {"cuda"} for kinds in devices.values()), devices
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.train()
    assert all(step["kl"] >= 0.0 for step in result.history)  # the default k3 estimator is non-negative
    assert all(math.isfinite(v) for step in result.history for v in step.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert (result.run_dir / "model" / "config.json").is_file()


@pytest.mark.parametrize("accelerate_config", ["ddp", "fsdp"])
def test_one_gpu_process_trains_under_each_shipped_config(accelerate_config, tiny_model_dir, tmp_path) -> None:
    """The shipped accelerate configs launch and train on one GPU: under FSDP the engine samples
    from the replica gathered from the shards, and the exported model is the trained one."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    run = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl",
            "train",
            "--model",
            str(tiny_model_dir),
            "--max-steps",
            "2",
            "--prompts-per-step",
            "2",
            "--num-generations",
            "4",
            "--output-dir",
            str(run),
            "--num-processes",
            "1",
            "--accelerate-config",
            accelerate_config,
            "--set",
            "eval_tasks=0",
            "--set",
            "checkpoint_every=0",
            "--set",
            "learning_rate=1e-3",
            "--set",
            "max_new_tokens=8",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(run / "model" / "model.safetensors")
    assert after.keys() == before.keys()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
