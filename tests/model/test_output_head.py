"""Models whose logits are not the output head on the last hidden state (Gemma 2 caps them, Cohere
scales them, Granite divides them): the training forward's logprobs are the model's own, as the
engine samples them, padded and packed, with gradients."""

from __future__ import annotations

import pytest
import torch
from test_packing import _group
from transformers import (
    CohereConfig,
    CohereForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from agentrl.model.output_head import head_matches
from agentrl.model.policy import TokenLogprobs

SHAPE = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)  # fmt: skip
MODELS = {
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**SHAPE, head_dim=8, final_logit_softcapping=0.5)),
    "cohere": lambda: CohereForCausalLM(CohereConfig(**SHAPE, logit_scale=0.25)),
    "granite": lambda: GraniteForCausalLM(GraniteConfig(**SHAPE, logits_scaling=4.0)),
}


def reference(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Each row's logprobs of its loss-mask tokens from the model's own logits, one unpadded row at
    a time, log-softmax in float64."""
    out = torch.zeros(ids.shape, dtype=torch.float64)
    for i in range(len(ids)):
        n = int(mask[i].sum())
        with torch.no_grad():
            logits = model(input_ids=ids[i : i + 1, :n]).logits[0].double()  # (n, V)
        picked = logits.log_softmax(-1)[:-1].gather(-1, ids[i, 1:n, None])[:, 0]  # (n-1,)
        out[i, 1:n] = picked * loss_mask[i, 1:n]
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("pack", [False, True])
def test_capped_and_scaled_logits_give_the_models_own_logprobs(name: str, pack: bool) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    with torch.no_grad():  # logits far from zero, so capping and scaling show
        model.get_output_embeddings().weight.mul_(40.0)
    assert not head_matches(model)
    ids, mask, loss_mask = _group(SHAPE["vocab_size"], seed=1)
    policy = TokenLogprobs(model, pack=pack)
    assert not policy.head_is_logits and policy.pack == pack  # the packed forward runs where asked
    logprobs, _ = policy(ids, mask, loss_mask)
    expected = reference(model, ids, mask, loss_mask)
    assert (expected != 0).any()
    torch.testing.assert_close(logprobs.double(), expected, atol=1e-5, rtol=0)
    head_only = TokenLogprobs(model, pack=pack)  # what applying the bare head would have given
    head_only.head_is_logits = True
    assert (head_only(ids, mask, loss_mask)[0].double() - expected).abs().max() > 1e-2
    logprobs.sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


def test_a_plain_head_is_applied_by_the_trainer_itself() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE)
    assert TokenLogprobs(LlamaForCausalLM(config)).head_is_logits
