"""A tied input/output embedding whose two gradients meet without a fresh (vocab x hidden) tensor.

When the input embedding and the output head share one weight (SmolLM2 ties them), backward gives
that weight two gradients: the head's, dense, and the lookup's, which touches only the rows of the
ids looked up. Autograd sums the two in the weight's input buffer. Taken dense, the lookup's
gradient is a fresh tensor of zeros with a few rows filled and the sum another fresh one; taken
sparse (``F.embedding(..., sparse=True)``), autograd still adds it out of place, into a copy of
the head's gradient (it adds in place only two dense tensors). A fresh (vocab x hidden) float32
tensor is 113 MB on the default model, returned to the system and faulted in again page by page
at every micro-batch's backward: ~0.2 s each on a 2-core CPU.

:func:`split_tied` hands the weight out as two views, one for the lookup and one for the head,
through one autograd node whose backward receives both gradients and adds the sparse rows into the
head's gradient in place; the weight's ``.grad`` gets one dense gradient, as the optimizer expects.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def tied_embedding(model: nn.Module) -> nn.Embedding | None:
    """The model's input embedding where its gradient can be taken sparse: a plain ``nn.Embedding``
    (no ``max_norm``, no frequency scaling, not a subclass that scales its output) whose trained
    weight is the output head's too, so the summed gradient reaching ``.grad`` is dense."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    if type(embedding) is not nn.Embedding or head is None or embedding.weight is not head.weight:
        return None
    if not embedding.weight.requires_grad or embedding.max_norm is not None or embedding.scale_grad_by_freq:
        return None
    return embedding


def split_tied(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` as (the lookup's view, the head's view): use the first with
    ``F.embedding(..., sparse=True)`` and the second as the head's weight; their gradients reach
    ``weight`` summed, dense, with no (vocab x hidden) tensor allocated for the sum."""
    return _SplitTied.apply(weight)


class _SplitTied(torch.autograd.Function):
    """Autograd for :func:`split_tied`: identity forward, the two gradients summed in backward."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two views of ``weight`` (no copy)."""
        return weight.view_as(weight), weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad_lookup: torch.Tensor | None, grad_head: torch.Tensor | None) -> torch.Tensor | None:
        """The head's dense gradient with the lookup's (sparse) rows added in place; the lookup's
        alone made dense when the head had none (a micro-batch with nothing to predict)."""
        if grad_lookup is None:
            return grad_head
        if grad_head is None:
            return grad_lookup.to_dense() if grad_lookup.is_sparse else grad_lookup
        if not grad_head.is_contiguous() or grad_head.dtype != grad_lookup.dtype:
            return grad_head + grad_lookup  # an expanded or cast gradient is not ours to write into
        return grad_head.add_(grad_lookup)
