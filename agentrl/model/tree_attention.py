"""Attention over a packed prefix tree computed block by block, each block against its ancestors only.

A packed micro-batch (:mod:`agentrl.model.packing`) is one sequence whose positions attend to their
ancestors in a prefix tree. ``sdpa`` given that as a dense ``(L, L)`` mask computes every query
against every key and masks most of them out: a GRPO group's completions each attend to the prompt
and themselves, an agent episode's segments to the system prompt and their own call, yet the dense
kernel pays for all ``L**2`` pairs. On an agent-shaped micro-batch (a 950-token system prompt, 10
segments, 3,440 packed positions; the default model in fp32 on 2 cores) attention was half of the
forward and backward.

Positions are created row by row, so a row's new positions are one run of consecutive positions, a
*block*, each the child of the one before; the first's parent (its branch point) lies in an earlier
block. :class:`TreeBlocks` lists the blocks with each one's key positions (its ancestors, then
itself); :func:`tree_attention` runs ``sdpa`` once per block on those keys with a mask that is
causal within the block, so the work is the sum over blocks of block length x (ancestors + block
length). Outputs equal the dense mask's to float rounding (the softmax sums the same terms in
another order).

:func:`use_tree_attention` installs it as transformers' ``sdpa`` attention function (through
``AttentionInterface.register``, once per process, wrapping the function registered there before)
and says whether a model can use it (it is on ``sdpa``). A call without the :data:`KEYWORD`
argument (any other model, the engine sampling from the trainer's module, a forward outside the
trainer) and every call this path does not implement (soft-capping, sinks, a position bias, a
sliding window) go to the wrapped function unchanged. The model's attention stays named ``sdpa``,
so copies of it (the engine's sampling copy, a reference model, another process) are what they were,
and a gradient checkpointing recompute in the backward takes the same path as the forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

KEYWORD = "agentrl_tree"
"""The keyword argument the packed forward passes its :class:`TreeBlocks` in (transformers hands a
model forward's extra keyword arguments down to every attention call)."""
UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias", "sliding_window")
"""Keyword arguments that, when set, send a call to ``sdpa`` with the dense mask."""
_wrapped: list[Callable[..., Any]] = []  # the ``sdpa`` function tree_attention replaced, once installed


@dataclass(frozen=True)
class TreeBlocks:
    """A packed sequence's L positions as consecutive blocks (chains of the prefix tree).

    ``bounds[b]`` is block b's ``[start, end)``. ``index`` holds every block's key positions one
    block after the other (its ancestors, then the block itself); ``key_bounds[b]`` is block b's
    ``[start, end)`` in it. ``masks[b]`` is the ``(1, 1, end - start, keys)`` bool mask (True:
    attend), None for a block without ancestors (causal over itself).
    """

    bounds: tuple[tuple[int, int], ...]
    index: torch.Tensor
    key_bounds: tuple[tuple[int, int], ...]
    masks: tuple[torch.Tensor | None, ...]

    @classmethod
    def from_parents(cls, parents: list[int], device: torch.device | str = "cpu") -> TreeBlocks:
        """The blocks of a tree whose position ``i`` has parent ``parents[i]`` (-1: a root), every
        parent earlier than its child."""
        starts = [i for i, parent in enumerate(parents) if i == 0 or parent != i - 1]
        bounds = tuple(zip(starts, [*starts[1:], len(parents)]))
        block_of: list[int] = []
        ancestors: list[list[tuple[int, int]]] = []  # per block: ranges of ancestor positions, root first
        ranges: list[tuple[int, int]] = []  # every block's key ranges, in order
        key_bounds: list[tuple[int, int]] = []
        masks: list[torch.Tensor | None] = []
        for b, (start, end) in enumerate(bounds):
            block_of.extend([b] * (end - start))
            branch = parents[start]
            above: list[tuple[int, int]] = []
            if branch >= 0:
                owner = block_of[branch]
                above = [*ancestors[owner], (bounds[owner][0], branch + 1)]
            ancestors.append(above)
            ranges += [*above, (start, end)]
            size, seen = end - start, sum(hi - lo for lo, hi in above)
            first = key_bounds[-1][1] if key_bounds else 0
            key_bounds.append((first, first + seen + size))
            mask = None
            if above:  # every ancestor, then causal within the block
                mask = torch.ones(size, seen + size, dtype=torch.bool)
                mask[:, seen:] = torch.ones(size, size, dtype=torch.bool).tril()
                mask = mask[None, None].to(device)
            masks.append(mask)
        index = torch.cat([torch.arange(lo, hi) for lo, hi in ranges]).to(device)
        return cls(bounds, index, tuple(key_bounds), tuple(masks))

    @property
    def pairs(self) -> int:
        """Query-key pairs the blocks compute (a dense mask computes L**2)."""
        return sum((end - start) * (hi - lo) for (start, end), (lo, hi) in zip(self.bounds, self.key_bounds))


def tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` (B, Hq, L, D), ``key``/``value``
    (B, Hk, L, D); returns the output (B, L, Hq, D) and no weights. With a :class:`TreeBlocks` in
    ``kwargs[KEYWORD]`` (and none of :data:`UNSUPPORTED`), block by block; otherwise ``sdpa``.

    The keys and values of every block are gathered in one ``index_select`` each, in float32, and
    each block's cast to the query's dtype (float32 under autocast, where RoPE leaves the query in
    float32 and ``sdpa`` casts its inputs): their gradients are summed in float32, so a recompute
    (gradient checkpointing) gives the same gradient bit for bit; summed in bf16 (the values under
    autocast) they differed in rounding."""
    sdpa_attention_forward = _wrapped[0] if _wrapped else _transformers_sdpa()
    blocks: TreeBlocks | None = kwargs.pop(KEYWORD, None)
    plain = blocks is not None and all(kwargs.get(name) is None for name in UNSUPPORTED)
    if not plain or key.shape[2] != query.shape[2] or query.shape[2] != blocks.bounds[-1][1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    keys, values = (_wide(t).index_select(2, blocks.index) for t in (key, value))
    outputs = []
    for (start, end), (lo, hi), mask in zip(blocks.bounds, blocks.key_bounds, blocks.masks):
        block_key, block_value = keys[:, :, lo:hi].to(query.dtype), values[:, :, lo:hi].to(query.dtype)
        out, _ = sdpa_attention_forward(
            module, query[:, :, start:end], block_key, block_value, mask, dropout, scaling, **kwargs
        )
        outputs.append(out)  # (B, block, Hq, D)
    return torch.cat(outputs, dim=1), None


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32 where it is a 16-bit float (else as it is)."""
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


def _transformers_sdpa() -> Callable[..., Any]:
    """transformers' own ``sdpa`` function (before :func:`use_tree_attention` installed this one)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def use_tree_attention(model: torch.nn.Module) -> bool:
    """Whether ``model``'s packed forward can attend block by block (it is a transformers model on
    ``sdpa``), installing :func:`tree_attention` as the ``sdpa`` function if it is not yet.

    Models on another implementation (eager, flash, flex) keep theirs: the packed forward passes
    them the dense mask alone."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if not _wrapped:
        _wrapped.append(ALL_ATTENTION_FUNCTIONS["sdpa"])
        AttentionInterface.register("sdpa", tree_attention)
    return True
