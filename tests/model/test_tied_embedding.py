"""A tied embedding split in two views: the same gradient as one weight used twice, summed in place."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_packing import _group  # six rows sharing a prompt (same folder)
from torch.utils._python_dispatch import TorchDispatchMode

from agentrl.model.policy import TokenLogprobs
from agentrl.model.tied_embedding import split_tied
from agentrl.testing import build_tiny_model


class FullSizeResults(TorchDispatchMode):
    """Names the operators that return a new dense tensor of ``shape`` (not a view or an input
    written in place: its memory is no argument's)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape, self.made = shape, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.layout == torch.strided and tuple(out.shape) == self.shape:
            inputs = {
                a.untyped_storage().data_ptr()
                for a in args
                if isinstance(a, torch.Tensor) and a.layout == torch.strided
            }
            if out.untyped_storage().data_ptr() not in inputs:
                self.made.append(str(func.overloadpacket))
        return out


class LookupOnly(TokenLogprobs):
    """The sparse lookup with the head's own module, as before the split: the gradients meet out of place."""

    def _weights(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.model.get_input_embeddings().weight, None


def test_the_split_weight_gets_the_summed_gradient_dense() -> None:
    """Against an independent computation: one weight used for both a lookup and a head."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    ids, probe = torch.tensor([3, 7, 3, 49]), torch.randn(4, 50, generator=g, dtype=torch.float64)

    def loss(lookup: torch.Tensor, head: torch.Tensor, sparse: bool) -> torch.Tensor:
        hidden = F.embedding(ids, lookup, sparse=sparse).tanh()
        return (F.linear(hidden, head) * probe).sum()

    (expected,) = torch.autograd.grad(loss(weight, weight, False), weight)
    loss(*split_tied(weight), True).backward()
    assert not weight.grad.is_sparse
    torch.testing.assert_close(weight.grad, expected, rtol=0, atol=1e-12)
    weight.grad = None  # the head unused (nothing to predict): the lookup's rows alone, dense
    lookup, _ = split_tied(weight)
    F.embedding(ids, lookup, sparse=True).sum().backward()
    assert not weight.grad.is_sparse
    torch.testing.assert_close(
        weight.grad, torch.zeros(50, 8, dtype=torch.float64).index_add_(0, ids, torch.ones(4, 8, dtype=torch.float64))
    )


@pytest.mark.parametrize("pack", [False, True])
def test_a_tied_policy_backward_makes_one_vocab_sized_tensor_not_two(pack: bool) -> None:
    """The split: the head's gradient is the only new (vocab x hidden) tensor of the backward (the
    looked-up rows are added into it); the sparse lookup alone makes a second, the sum."""
    model = build_tiny_model(vocab_size=512)
    shape = tuple(model.get_input_embeddings().weight.shape)
    ids, mask, loss_mask = _group(shape[0], seed=0)
    made = {}
    for name, policy in (("split", TokenLogprobs(model, pack=pack, sparse_embedding=True)),
                         ("lookup only", LookupOnly(model, pack=pack, sparse_embedding=True))):  # fmt: skip
        model.zero_grad(set_to_none=True)
        logprobs, _ = policy(ids, mask, loss_mask)
        with FullSizeResults(shape) as seen:
            logprobs.sum().backward()
        made[name] = seen.made
    assert made["split"] == ["aten.mm"], made
    assert made["lookup only"] == ["aten.mm", "aten.add"], made
