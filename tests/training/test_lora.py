"""LoRA (agentrl.model.lora) on the tiny model: only the adapter trains, the reference is the base model
with the adapter off, engines sample from the merged weights, export and resume are exact."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from agentrl.config.lora import LLAMA_TARGETS
from agentrl.config.startup import resolved_dict
from agentrl.config.train import TrainConfig, build_config
from agentrl.errors import ConfigError, TrainingInterrupted
from agentrl.model.lora import sampling_model
from agentrl.model.policy import TokenLogprobs
from agentrl.plugins import load_plugins
from agentrl.testing import lockstep_plugins, parity_reward
from agentrl.training.trainer import Trainer

pytest.importorskip("peft")
from test_resume import _assert_same_weights, _config, _lines, _manager  # noqa: E402  (its helpers)

LORA = {"r": 4, "alpha": 8}  # scale alpha / r = 2


def _trainer(model_dir, tmp_path, **overrides) -> Trainer:
    base = dict(
        model=str(model_dir),
        max_steps=2,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(tmp_path / "run"),
        log_completions_every=0,
        save_model=False,
        checkpoint_every=0,
        precision="fp32",
        learning_rate=1e-2,
        lora=LORA,
        rewards={"parity": 1.0},
        plugins=lockstep_plugins(),
    )
    base.update(overrides)
    manager = load_plugins()
    manager.registry.add("reward", "parity", parity_reward, plugin="test")  # a signal even for a random model
    return Trainer(TrainConfig(**base), manager)


def _step(trainer: Trainer, step: int = 1):
    batch, _, metrics = trainer.rollout_step(step)
    trainer.update(batch, metrics, step)
    return batch


def _merged_float64(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Plain-named weights computed by hand from the peft model's tensors: W + (alpha / r) B A."""
    params = dict(trainer.model.named_parameters())
    out = {}
    for name, tensor in params.items():
        plain = name.removeprefix("base_model.model.")
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            stem = name.removesuffix(".base_layer.weight")
            a, b = params[f"{stem}.lora_A.default.weight"].double(), params[f"{stem}.lora_B.default.weight"].double()
            out[plain.replace(".base_layer.", ".")] = tensor.double() + 2.0 * (b @ a)
        else:
            out[plain] = tensor.double()
    return out


def test_only_the_adapter_trains_and_the_base_stays_bit_identical(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    optimized = [p for group in trainer.run.trained["policy"].optimizer.param_groups for p in group["params"]]
    assert optimized and all(p.requires_grad for p in optimized)
    assert {id(p) for p in optimized} == {id(p) for n, p in trainer.model.named_parameters() if ".lora_" in n}
    assert not trainer.model.training  # dropout off (docs/concepts/guards.md#dropout)
    _step(trainer)
    for name, p in trainer.model.named_parameters():
        if ".lora_B." in name:
            assert not torch.equal(p, before[name]), name  # B starts at 0 and moved
        elif ".lora_" not in name:
            assert torch.equal(p, before[name]), name  # base weights untouched, bit for bit
    adapted = {n.split(".lora_")[0].rpartition(".")[2] for n in before if ".lora_" in n}
    assert adapted == set(LLAMA_TARGETS)


def test_reference_is_the_base_model_with_the_adapter_off(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, algorithm={"beta": 0.1})
    assert trainer.run.ref_model is trainer.model  # no second copy of the model
    _step(trainer, 1)  # the adapter is now non-zero
    batch = _step(trainer, 2)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected, _ = TokenLogprobs(base)(batch.input_ids, batch.attention_mask, batch.loss_mask)
        policy, _ = TokenLogprobs(trainer.model)(batch.input_ids, batch.attention_mask, batch.loss_mask)
    torch.testing.assert_close(batch.extras["ref_logprobs"], expected, rtol=0, atol=1e-5)
    assert (policy - expected).abs().max() > 1e-3  # the adapter is on again and changes the policy


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_samples_from_the_merged_weights(tiny_model_dir, tmp_path, dtype):
    trainer = _trainer(tiny_model_dir, tmp_path, engine_args={"dtype": dtype})
    _step(trainer)
    engine_model = trainer.engine.model
    base_names = set(AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict())
    assert set(engine_model.state_dict()) == base_names  # plain HF names, no lora_A/B, no peft prefix
    expected = _merged_float64(trainer)
    params = dict(engine_model.named_parameters(remove_duplicate=False))
    assert params["lm_head.weight"] is params["model.embed_tokens.weight"]  # still tied
    moved = 0
    for name, tensor in params.items():
        want = expected.get(name, expected.get("model.embed_tokens.weight") if name == "lm_head.weight" else None)
        if dtype == "float32":
            torch.testing.assert_close(tensor.double(), want, rtol=1e-6, atol=1e-7)
        else:  # the bf16 copy of the merged fp32 weights: within one bf16 rounding
            assert tensor.dtype == torch.bfloat16
            torch.testing.assert_close(tensor.double(), want, rtol=2**-8, atol=1e-6)
        moved += "proj" in name and not torch.equal(want, expected_base(trainer, name))
    assert moved == 2 * 7  # every adapted layer of both blocks samples with its update


def expected_base(trainer: Trainer, name: str) -> torch.Tensor:
    """The base weight of a plain name (adapted layers: their ``base_layer``), float64."""
    params = {
        n.removeprefix("base_model.model.").replace(".base_layer.", "."): p for n, p in trainer.model.named_parameters()
    }
    return params[name].double()


def test_sampling_model_of_a_plain_model_is_the_model_itself(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert sampling_model(model) is model


def test_export_is_merged_the_adapter_loads_with_peft_and_eval_runs(tiny_model_dir, tmp_path):
    from peft import PeftModel

    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=2, save_model=True, algorithm={"beta": 0.05})
    result = trainer.train()
    files = {p.name for p in result.run_dir.iterdir()}
    assert {"model", "adapter"} <= files
    exported = AutoModelForCausalLM.from_pretrained(result.run_dir / "model").eval()
    assert not any("lora" in k or "base_layer" in k for k in load_file(result.run_dir / "model" / "model.safetensors"))
    ids = torch.tensor([[1, 5, 9, 300, 77, 2, 41]])
    with torch.no_grad():
        trained = trainer.model(input_ids=ids).logits
        adapter = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir), result.run_dir / "adapter"
        ).eval()
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
        torch.testing.assert_close(exported(input_ids=ids).logits, trained, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(adapter(input_ids=ids).logits, trained, rtol=0, atol=1e-6)
    assert (trained - base).abs().max() > 1e-3  # training changed something worth exporting

    from typer.testing import CliRunner

    from agentrl.cli.app import app

    evaluated = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(result.run_dir),
            "--env",
            "math",
            "--num-tasks",
            "2",
            "--max-new-tokens",
            "4",
            "--json",
        ],
    )
    assert evaluated.exit_code == 0, evaluated.output
    assert "eval/accuracy" in json.loads(evaluated.stdout.strip().splitlines()[-1])


def test_resume_with_lora_equals_straight_bit_for_bit(tiny_model_dir, tmp_path, monkeypatch):
    from agentrl.rundir.directory import resume_config

    extra = dict(lora=LORA, algorithm={"beta": 0.05}, eval_tasks=0, max_steps=3, rewards={"parity": 1.0})

    def manager(folder):
        plugins = _manager(folder)
        plugins.registry.add("reward", "parity", parity_reward, plugin="test")
        return plugins

    straight = tmp_path / "straight"
    Trainer(_config(tiny_model_dir, straight, **extra), manager(tmp_path / "a")).train()
    split = tmp_path / "split"
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_AT", "2")
    monkeypatch.setenv("AGENTRL_TEST_SIGINT_IN", "update")
    with pytest.raises(TrainingInterrupted):
        Trainer(_config(tiny_model_dir, split, **extra), manager(tmp_path / "b")).train()
    checkpoint = split / "checkpoints" / "step-000002"
    assert (checkpoint / "adapter").is_dir() and not (checkpoint / "model").exists()  # the adapter alone
    optim = torch.load(checkpoint / "optimizers.pt", weights_only=True)["policy"]
    assert len(optim["state"]) == 2 * 2 * 7  # Adam moments of A and B of 7 layers x 2 blocks, nothing else
    monkeypatch.delenv("AGENTRL_TEST_SIGINT_AT")
    config, folder = resume_config(split)
    Trainer(config, manager(tmp_path / "c"), resume=folder).train()
    assert _lines(split) == _lines(straight)
    _assert_same_weights(straight / "model", split / "model")
    _assert_same_weights(straight / "adapter", split / "adapter")
    trained = load_file(split / "adapter" / "adapter_model.safetensors")
    assert all(bool(t.any()) for k, t in trained.items() if "lora_B" in k)  # the adapter did train


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["lora.r=0"], "lora.r=0 is invalid: expected an integer >= 1"),
        (["lora.r=1.5"], "lora.r must be an integer, got 1.5"),
        (["lora.r=true"], "lora.r must be an integer, got True"),
        (["lora.alpha=0"], "lora.alpha=0 is invalid: expected null (2 * r) or a finite number > 0"),
        (["lora.alpha=.inf"], "lora.alpha must be a finite number or null, got inf"),
        (["lora.dropout=1"], "lora.dropout=1 is invalid: expected a number in [0, 1)"),
        (["lora.dropout=0.1"], "lora.dropout=0.1 is invalid: expected 0: the policy runs in eval mode"),
        (["lora.target_modules=[]"], "lora.target_modules=[] is invalid: expected 'all-linear' or a non-empty list"),
        (["lora.target_modules=5"], "lora.target_modules=5 is invalid"),
        (["lora.target_modules=all"], "lora.target_modules='all' is invalid"),
        (["lora.bias=all"], "lora.bias='all' is invalid: expected 'none'"),
        (["lora.rank=8"], "unknown key(s) 'rank' in lora; LoRAConfig accepts: alpha, bias, dropout, r, target_modules"),
        (["lora=8"], "lora must be a mapping of names to values or null, got 8"),
    ],
)
def test_bad_lora_values_are_one_named_error(sets, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config(sets=sets)


def test_lora_options_resolve_in_print_config():
    config = build_config(sets=["lora.r=8"])
    data = resolved_dict(config, load_plugins())
    assert data["lora"] == {
        "r": 8,
        "alpha": None,
        "dropout": 0.0,
        "target_modules": list(LLAMA_TARGETS),
        "bias": "none",
    }
    assert resolved_dict(build_config(), load_plugins())["lora"] is None  # full fine-tune
    assert build_config(sets=["lora={}"]).lora == {}  # LoRA with every default


def test_layers_the_model_lacks_and_a_missing_peft_are_named(tiny_model_dir, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"lora: peft could not add the adapter .* set lora.target_modules"):
        _trainer(tiny_model_dir, tmp_path, lora={"target_modules": ["c_attn"]})
    monkeypatch.setitem(sys.modules, "peft", None)  # importing it now raises ImportError
    with pytest.raises(ConfigError, match=re.escape("pip install 'agentrl[lora]'")):
        _trainer(tiny_model_dir, tmp_path / "b")
