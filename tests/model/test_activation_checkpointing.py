"""``gradient_checkpointing: true`` (agentrl.model.activation_checkpointing): each decoder block keeps only
its inputs for the backward pass and runs again there, in eval mode too; the gradients are those of
the plain forward, the saved activations far fewer, and a run trains the same weights."""

from __future__ import annotations

import copy

import pytest
import torch
from cli_in_process import agentrl_in_process
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError
from agentrl.model.activation_checkpointing import blocks, checkpoint_blocks, is_checkpointed
from agentrl.model.policy import TokenLogprobs
from agentrl.plugins import load_plugins
from agentrl.testing import lockstep_plugins, parity_reward
from agentrl.training.trainer import Trainer

LAYERS = 4


def _llama() -> LlamaForCausalLM:
    """A float64 Llama with more layers and a smaller vocabulary than the tiny model, so that the
    decoder blocks, not the output head, hold most of what a forward saves."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).double().eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows sharing a prefix (packable), one right-padded; loss on the tokens after position 5."""
    ids = torch.randint(3, 96, (4, 20), generator=torch.Generator().manual_seed(1))
    ids[1:, :8] = ids[0, :8]
    attention = torch.ones_like(ids)
    attention[3, 15:] = 0
    loss_mask = attention.double()
    loss_mask[:, :6] = 0
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return ids, attention, loss_mask, weights


def _gradients_and_saved_bytes(model: nn.Module, pack: bool) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of a weighted logprob sum, and the bytes autograd saved for the backward pass."""
    ids, attention, loss_mask, weights = _batch()
    saved = []

    def pack_hook(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    policy = TokenLogprobs(model, pack=pack)
    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda tensor: tensor):
        logprobs, _ = policy(ids, attention, loss_mask)
    (logprobs.double() * weights).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}, sum(saved)


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_checkpointed_blocks_give_the_plain_gradients_and_save_a_fraction(pack: bool) -> None:
    plain = _llama()
    checkpointed = copy.deepcopy(plain)
    wrapped = checkpoint_blocks(checkpointed)
    assert len(wrapped) == LAYERS and all(is_checkpointed(b) for b in wrapped)
    assert wrapped == list(checkpointed.model.layers) and not checkpointed.training  # eval mode kept
    expected, plain_bytes = _gradients_and_saved_bytes(plain, pack)
    got, checkpointed_bytes = _gradients_and_saved_bytes(checkpointed, pack)
    assert expected.keys() == got.keys()
    for name in expected:
        assert expected[name].abs().sum() > 0, name  # every weight is reached
        torch.testing.assert_close(got[name], expected[name], rtol=1e-12, atol=1e-14, msg=name)
    # Inside a block nothing is saved: what is left is the embeddings, the head and the final norm.
    assert checkpointed_bytes < 0.25 * plain_bytes, (checkpointed_bytes, plain_bytes)


def test_blocks_run_again_in_the_backward_pass_only_when_autograd_records() -> None:
    model = _llama()
    checkpoint_blocks(model)
    policy = TokenLogprobs(model)  # built first: it checks the head with a forward of its own
    calls = []

    def counted(forward):  # a forward hook does not fire in checkpoint's recompute; the forward itself runs
        return lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs)

    for layer in model.model.layers:
        layer.mlp.forward = counted(layer.mlp.forward)
    ids, attention, loss_mask, weights = _batch()
    with torch.no_grad():
        policy(ids, attention, loss_mask)
    assert len(calls) == LAYERS  # no recompute without a backward pass
    calls.clear()
    logprobs, _ = policy(ids, attention, loss_mask)
    assert len(calls) == LAYERS
    (logprobs * weights).sum().backward()
    assert len(calls) == 2 * LAYERS  # each block again, in the backward pass


def test_a_custom_stack_of_blocks_is_found_and_a_model_without_one_is_not() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(4, 8)
            self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3))
            self.heads = nn.ModuleList([nn.Linear(8, 1), nn.Linear(8, 2)])  # mixed classes: not a stack

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return self.heads[0](x)

    torch.manual_seed(0)
    model = Stack().double()
    other = copy.deepcopy(model)
    assert checkpoint_blocks(other) == list(other.layers)
    x = torch.randn(5, 4, dtype=torch.float64)
    model(x).sum().backward()
    other(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-14, msg=name)
    assert blocks(nn.Sequential(nn.Linear(2, 2))) == []
    assert checkpoint_blocks(other) == list(other.layers)  # again: nothing wrapped twice
    assert [c.__name__ for c in type(other.layers[0]).__mro__].count("_Checkpointed") == 1


def _trainer(model_dir, tmp_path, name: str, **overrides) -> Trainer:
    base = dict(
        model=str(model_dir),
        max_steps=2,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        eval_tasks=0,
        output_dir=str(tmp_path / name),
        log_completions_every=0,
        save_model=False,
        checkpoint_every=0,
        precision="fp32",
        learning_rate=1e-2,
        rewards={"parity": 1.0},
        plugins=lockstep_plugins(),
    )
    base.update(overrides)
    manager = load_plugins()
    manager.registry.add("reward", "parity", parity_reward, plugin="test")  # a signal even for a random model
    return Trainer(TrainConfig(**base), manager)


def _weights(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    return {
        name: {k: v.detach().clone() for k, v in trained.parameters_of.state_dict().items()}
        for name, trained in trainer.run.trained.items()
    }


def _two_steps(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    """The trained modules' weights after two steps (each of them moved)."""
    before = _weights(trainer)
    for step in (1, 2):
        batch, _, metrics = trainer.rollout_step(step)
        trainer.update(batch, metrics, step)
    after = _weights(trainer)
    for name in before:
        assert any(not torch.equal(after[name][k], v) for k, v in before[name].items()), f"{name} did not train"
    return after


@pytest.mark.parametrize(
    "overrides",
    [{}, {"algo": "ppo"}, {"lora": {"r": 4, "alpha": 8}}, {"precision": "bf16"}],
    ids=["grpo", "ppo-critic", "lora", "bf16-autocast"],
)  # the recompute runs under autocast too
def test_a_run_with_checkpointing_trains_the_same_weights(tiny_model_dir, tmp_path, overrides) -> None:
    if "lora" in overrides:
        pytest.importorskip("peft")
    plain = _two_steps(_trainer(tiny_model_dir, tmp_path, "plain", **overrides))
    trainer = _trainer(tiny_model_dir, tmp_path, "checkpointed", gradient_checkpointing=True, **overrides)
    for trained in trainer.run.trained.values():  # the policy, and PPO's critic: each has its blocks wrapped
        found = blocks(trained.parameters_of)
        assert found and all(is_checkpointed(b) for b in found)
    checkpointed = _two_steps(trainer)
    assert plain.keys() == checkpointed.keys() == ({"policy", "critic"} if overrides.get("algo") else {"policy"})
    for module in plain:
        for key, before in plain[module].items():
            torch.testing.assert_close(checkpointed[module][key], before, rtol=0, atol=1e-6, msg=f"{module}/{key}")


def test_a_policy_without_blocks_to_checkpoint_is_a_config_error(tiny_model_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(
        "agentrl.training.build.checkpoint_blocks", lambda model: []
    )  # as for a model with no block stack
    with pytest.raises(
        ConfigError,
        match="gradient_checkpointing=true: LlamaForCausalLM has no decoder blocks to "
        "checkpoint .*; set gradient_checkpointing false",
    ):
        _trainer(tiny_model_dir, tmp_path, "run", gradient_checkpointing=True)


def test_the_cli_says_what_it_checkpoints(tiny_model_dir, tmp_path) -> None:
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--prompts-per-step",
        "2",
        "--num-generations",
        "2",
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=4",
        "--set",
        "gradient_checkpointing=true",
        "--output-dir",
        str(tmp_path / "run"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    said = "gradient checkpointing: 2 decoder blocks (LlamaDecoderLayer) recomputed in the backward pass"
    assert said in result.stdout, result.stdout
