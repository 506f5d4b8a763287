"""Gradient (activation) checkpointing of a model's repeated blocks, whatever its train/eval mode.

A training forward keeps what every layer computed for the backward pass: about 1.8 MB a token for
SmolLM2-135M in bf16 autocast, a quarter of a step's peak memory on the calculator's multi-turn
episodes (docs/benchmarks/memory.md). With checkpointing each block (a decoder layer) keeps only its inputs,
and the backward pass runs the block's forward once more to rebuild the rest: the same gradients,
the update a fifth slower on the default job.

HF's ``gradient_checkpointing_enable`` checkpoints only in train mode, and agentrl keeps its models
in eval mode (dropout off: docs/concepts/guards.md#dropout), so the blocks are wrapped here: each block's class
becomes a
subclass whose ``forward`` runs under :func:`torch.utils.checkpoint.checkpoint` (non-reentrant:
keyword arguments, frozen inputs such as a LoRA base's embeddings, autocast and RNG state replayed)
whenever autograd records, without the key/value cache HF builds in eval mode. Copies made later
(the sampler's) keep the class; they run without gradients, where the block's own ``forward`` runs.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CACHE_ARGUMENTS = ("past_key_values", "past_key_value", "layer_past")
"""A block's key/value cache arguments, dropped under checkpointing (a training forward needs no cache)."""


class _Checkpointed:
    """Mixed in before a block's class: its forward recomputed in the backward pass."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        parent_forward = super().forward  # type: ignore[misc]
        if not torch.is_grad_enabled():
            return parent_forward(*args, **kwargs)
        for name in CACHE_ARGUMENTS:  # the recompute would append this block's keys to a cache again
            if kwargs.get(name) is not None:
                kwargs[name] = None
        return checkpoint(parent_forward, *args, use_reentrant=False, **kwargs)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules to checkpoint: those transformers marks as checkpointable layers
    (``GradientCheckpointingLayer``; outermost ones only), else the items of the longest
    ``nn.ModuleList`` of modules of one class (a custom model's stack of blocks)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers before 4.52 has no such base class
        GradientCheckpointingLayer = ()  # noqa: N806
    marked = {name: module for name, module in model.named_modules() if isinstance(module, GradientCheckpointingLayer)}
    outer = [m for name, m in marked.items() if not any(name.startswith(f"{other}.") for other in marked)]
    if outer:
        return outer
    stacks = [
        m
        for m in model.modules()
        if isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(child) for child in m}) == 1
    ]
    return list(max(stacks, key=len)) if stacks else []


def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``module`` is a block wrapped by :func:`checkpoint_blocks`."""
    return isinstance(module, _Checkpointed)


def checkpointed_summary(model: nn.Module) -> str:
    """What is checkpointed in ``model``, for the start-up banner: ``30 decoder blocks (LlamaDecoderLayer)
    recomputed in the backward pass``."""
    wrapped = [m for m in model.modules() if is_checkpointed(m)]
    mros = [type(m).__mro__ for m in wrapped]
    names = sorted({mro[mro.index(_Checkpointed) + 1].__name__ for mro in mros})  # the block's own class
    return f"{len(wrapped)} decoder blocks ({', '.join(names)}) recomputed in the backward pass"


def checkpoint_blocks(model: nn.Module) -> list[nn.Module]:
    """Checkpoint every block of ``model`` (:func:`blocks`) in place; returns them (empty: nothing
    found to checkpoint, the model unchanged). Calling it again changes nothing."""
    found = blocks(model)
    for block in found:
        if not is_checkpointed(block):
            block.__class__ = _checkpointed_class(type(block))
    return found


@cache
def _checkpointed_class(cls: type) -> type:
    """``cls`` with :class:`_Checkpointed` first in its MRO (one per block class)."""
    return type(f"Checkpointed{cls.__name__}", (_Checkpointed, cls), {"__module__": cls.__module__})
