"""The logprobs of chosen tokens and each row's entropy from LM-head logits, a few rows at a time.

The training forward needs, per predicted token, ``log_softmax(logits / T)`` at that token, and
per row the entropy of the distribution. Written as tensor operations that is a float32 copy of the
(U, V) logits, a (U, V) log-softmax, a (U, V) tensor of zeros that the gather's backward fills, the
log-softmax's (U, V) backward and a cast of it back to the logits' dtype, each over the whole
vocabulary (49,152 on the default model): on a 2-core CPU about a fifth of a bf16 update.
:func:`selected_logprobs` computes the same in blocks of :data:`ROWS_PER_BLOCK` rows kept in
float32 while they are in cache: the forward keeps only the logits for the backward, which
recomputes each block's softmax and writes ``d logprob / d logits = (onehot - softmax) / T``
straight in the logits' dtype. Values equal the tensor form's to float32 rounding (tests/model/test_selected_logprobs.py
against float64).
"""

from __future__ import annotations

from typing import Any

import torch

ROWS_PER_BLOCK = 32
"""Rows of logits turned into float32 at a time (32 x 49,152 x 4 bytes = 6 MiB on the default model)."""


def selected_logprobs(
    logits: torch.Tensor, where: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(logits / temperature)[where, token_ids]`` (K,) in float32 (float64 for float64
    logits), differentiable in
    ``logits`` (U, V), and the entropy (U,) of each row's distribution (no gradient; None unless
    ``entropy``). ``where`` (K,) is the row of each chosen token: rows may be chosen from many times
    (a shared prefix predicts every branch's next token) or not at all."""
    picked, row_entropy = _SelectedLogprobs.apply(logits, where, token_ids, 1.0 / temperature, entropy)
    return picked, row_entropy if entropy else None


def _scaled(block: torch.Tensor, compute: torch.dtype, scale: float, into: torch.Tensor | None) -> torch.Tensor:
    """``block x scale`` in ``compute``: written into ``into`` (a reused buffer of at least as many
    rows) when given, else the logits themselves when nothing changes (never written to)."""
    if into is None:
        return block * scale if scale != 1.0 else block
    out = into[: block.shape[0]].copy_(block)
    return out.mul_(scale) if scale != 1.0 else out


def _buffers(logits: torch.Tensor, compute: torch.dtype, scale: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Two blocks' worth of ``compute`` memory, reused for every block of a call: one for the scaled
    block (None when the logits serve as they are), one for what is computed from it. A fresh
    allocation per block (6 MiB on the default model) is returned to the system and faulted in
    again page by page each time, which cost more than the cast itself (bench/selected_logprobs.py)."""

    def block() -> torch.Tensor:
        return torch.empty(min(ROWS_PER_BLOCK, logits.shape[0]), logits.shape[1], dtype=compute, device=logits.device)

    return (None if logits.dtype == compute and scale == 1.0 else block()), block()


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32, or the logits' own dtype where it is wider (float64)."""
    return torch.promote_types(logits.dtype, torch.float32)


class _SelectedLogprobs(torch.autograd.Function):
    """Autograd for :func:`selected_logprobs` (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, where: torch.Tensor, token_ids: torch.Tensor, scale: float, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's log-normaliser and entropy block by block; the chosen tokens' logprobs."""
        rows, compute = logits.shape[0], _compute_dtype(logits)
        lse = torch.empty(rows, dtype=compute, device=logits.device)  # (U,)
        row_entropy = torch.zeros(rows if entropy else 0, dtype=compute, device=logits.device)  # (U,)
        scaled, spare = _buffers(logits, compute, scale)
        for start in range(0, rows, ROWS_PER_BLOCK):
            span = slice(start, start + ROWS_PER_BLOCK)
            block = _scaled(logits[span], compute, scale, scaled)  # (b, V)
            top = block.amax(dim=-1, keepdim=True)  # (b, 1)
            weights = torch.sub(block, top, out=spare[: block.shape[0]]).exp_()  # (b, V) unnormalised probabilities
            total = weights.sum(dim=-1)  # (b,)
            lse[span] = top.squeeze(-1) + total.log()
            if entropy:  # H = lse - sum(p * x), p = weights / total
                row_entropy[span] = lse[span] - torch.linalg.vecdot(weights, block) / total
        picked = logits[where, token_ids].to(compute) * scale - lse[where]  # (K,)
        ctx.save_for_backward(logits, where, token_ids)
        ctx.scale = scale
        ctx.mark_non_differentiable(row_entropy)
        return picked, row_entropy

    @staticmethod
    def backward(ctx: Any, grad_picked: torch.Tensor, _grad_entropy: Any) -> tuple[Any, ...]:
        """``d/d logits = scale x (scatter(g) - G_u x softmax)``, ``G_u`` the summed gradient of
        row u's chosen tokens; written block by block in the logits' dtype."""
        logits, where, token_ids = ctx.saved_tensors
        scale = ctx.scale
        rows, compute = logits.shape[0], _compute_dtype(logits)
        per_row = torch.zeros(rows, dtype=compute, device=logits.device).index_add_(0, where, grad_picked.to(compute))
        grad = torch.empty_like(logits)  # (U, V)
        scaled, spare = _buffers(logits, compute, scale)
        for start in range(0, rows, ROWS_PER_BLOCK):
            stop = min(start + ROWS_PER_BLOCK, rows)
            block = _scaled(logits[start:stop], compute, scale, scaled)
            probs = torch.ops.aten._softmax.out(block, -1, False, out=spare[: stop - start])  # (b, V)
            block = probs.mul_(-scale * per_row[start:stop, None])  # (b, V)
            inside = (where >= start) & (where < stop)  # chosen tokens of this block's rows
            block.index_put_(
                (where[inside] - start, token_ids[inside]), scale * grad_picked[inside].to(compute), accumulate=True
            )
            grad[start:stop] = block
        return grad, None, None, None, None
