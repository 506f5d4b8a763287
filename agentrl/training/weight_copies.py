"""Copies of a model's weights that an asynchronous run hands from the learner to the engine: a
:func:`snapshot` (tied tensors copied once), put into a module of the same structure without a
second copy (:func:`adopt`), and freed again while the module is kept (:func:`on_meta`)."""

from __future__ import annotations

from typing import Any

import torch


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s state dict in which names of one tensor (a tied LM head and embedding)
    share one copy, as they share the original: SmolLM2's tied matrix is a fifth of its weights."""
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    weights = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
        if key not in copies:
            copies[key] = tensor.detach().clone()
        weights[name] = copies[key]
    return weights


def adopt(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Make the tensors of ``weights`` (a :func:`snapshot` of a model of ``model``'s structure)
    ``model``'s parameters and persistent buffers, without copying them; names that share one
    tensor in ``weights`` (a tied LM head and embedding) share one Parameter, as they did
    (``load_state_dict(assign=True)`` gives each name a Parameter of its own: the tie is lost)."""
    parameters: dict[int, torch.nn.Parameter] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for key, old in list(module.named_parameters(recurse=False)):
            tensor = weights[_qualified(prefix, key)]
            if id(tensor) not in parameters:
                parameters[id(tensor)] = torch.nn.Parameter(tensor, requires_grad=old.requires_grad)
            setattr(module, key, parameters[id(tensor)])
        for key, _ in list(module.named_buffers(recurse=False)):
            name = _qualified(prefix, key)
            if name in weights:  # a non-persistent buffer (RoPE's inv_freq) is in no state dict: kept
                setattr(module, key, weights[name])


def _qualified(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def on_meta(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` as storage-less tensors on the meta device (ties kept): what :func:`adopt` puts
    into a module whose tensors must be freed but whose structure is needed again."""
    metas: dict[int, torch.Tensor] = {}
    for tensor in weights.values():
        metas.setdefault(id(tensor), tensor.to("meta"))
    return {name: metas[id(tensor)] for name, tensor in weights.items()}
