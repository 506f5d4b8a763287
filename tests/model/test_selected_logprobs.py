"""``selected_logprobs`` against float64 ``log_softmax``: values, entropies and gradients, with rows
chosen several times or never, a temperature, blocks of rows and bf16 logits."""

from __future__ import annotations

import pytest
import torch

from agentrl.model import selected_logprobs as module
from agentrl.model.selected_logprobs import selected_logprobs


def reference(logits: torch.Tensor, where: torch.Tensor, token_ids: torch.Tensor, temperature: float):
    """Float64: the chosen tokens' log_softmax(logits / T) and -sum(p log p) per row."""
    log_probs = torch.log_softmax(logits.double() / temperature, dim=-1)  # (U, V)
    return log_probs[where, token_ids], -(log_probs.exp() * log_probs).sum(-1)


def case(rows: int = 7, vocab: int = 50, chosen: int = 12, seed: int = 0):
    """Logits with a wide range, rows chosen 0, 1 or several times (a packed prefix's branches)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 6 * torch.randn(rows, vocab, generator=generator)
    where = torch.randint(0, rows - 1, (chosen,), generator=generator)  # the last row is never chosen
    token_ids = torch.randint(0, vocab, (chosen,), generator=generator)
    upstream = torch.randn(chosen, generator=generator)  # d loss / d logprob of each chosen token
    return logits, where, token_ids, upstream


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("block", [32, 3])
def test_values_and_gradients_match_float64(temperature: float, block: int, monkeypatch) -> None:
    monkeypatch.setattr(module, "ROWS_PER_BLOCK", block)  # 3: several blocks and a partial last one
    logits, where, token_ids, upstream = case()
    expected, expected_entropy = reference(logits, where, token_ids, temperature)
    leaf = logits.clone().requires_grad_(True)
    picked, entropy = selected_logprobs(leaf, where, token_ids, temperature)
    assert picked.dtype == entropy.dtype == torch.float32 and not entropy.requires_grad
    torch.testing.assert_close(picked.double(), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy.double(), expected_entropy, atol=1e-5, rtol=0)
    (picked * upstream).sum().backward()
    exact = logits.double().requires_grad_(True)
    (reference(exact, where, token_ids, temperature)[0] * upstream.double()).sum().backward()
    torch.testing.assert_close(leaf.grad.double(), exact.grad, atol=1e-6, rtol=0)
    assert torch.all(leaf.grad[-1] == 0)  # a row never chosen gets no gradient


def test_gradcheck_in_float64() -> None:
    logits, where, token_ids, _ = case(rows=4, vocab=9, chosen=6)
    leaf = logits.double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: selected_logprobs(x, where, token_ids, 0.8)[0], (leaf,))


def test_bf16_logits_get_a_bf16_gradient_computed_in_float32() -> None:
    logits, where, token_ids, upstream = case()
    low = logits.to(torch.bfloat16).requires_grad_(True)
    picked, _ = selected_logprobs(low, where, token_ids)
    expected, _ = reference(low.detach(), where, token_ids, 1.0)  # the same bf16 values, exactly
    torch.testing.assert_close(picked.double(), expected, atol=1e-5, rtol=0)
    (picked * upstream).sum().backward()
    exact = low.detach().double().requires_grad_(True)
    (reference(exact, where, token_ids, 1.0)[0] * upstream.double()).sum().backward()
    assert low.grad.dtype == torch.bfloat16
    torch.testing.assert_close(low.grad.double(), exact.grad, atol=0, rtol=2**-8)  # one bf16 rounding


def test_entropy_is_skipped_when_not_asked_and_empty_selections_work() -> None:
    logits, where, token_ids, _ = case()
    picked, entropy = selected_logprobs(logits, where, token_ids, entropy=False)
    assert entropy is None and picked.shape == where.shape
    none = torch.zeros(0, dtype=torch.long)
    leaf = logits.clone().requires_grad_(True)
    picked, _ = selected_logprobs(leaf, none, none)
    (picked.sum() + 0.0 * leaf.sum()).backward()
    assert picked.shape == (0,) and torch.all(leaf.grad == 0)
