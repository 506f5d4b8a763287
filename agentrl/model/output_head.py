"""Whether a causal LM's logits are its output head applied to the decoder's last hidden state.

Most models' logits are ``lm_head(hidden)``; some post-process them in their forward: Gemma 2 and 3
cap them (``tanh(logits / c) * c``), Cohere scales them, Granite divides them. Code that runs the
decoder and applies the head itself (the trainer's logprobs at the loss positions only, the `hf`
engine's decode step on a CPU) checks with :func:`head_matches` first and otherwise asks the model's
own forward for the logits, so sampler and trainer logprobs come from the same distribution.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch

_CHECKED: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode (dropout off) for the block; every module's own mode restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def head_matches(model: torch.nn.Module) -> bool:
    """Whether the model's logits are its output embedding (a bias-free or biased ``nn.Linear``)
    applied to the decoder's last hidden state: checked once per model on a few tokens (max
    |difference| <= 1e-4), so a model that scales or caps its logits keeps its own forward."""
    if model in _CHECKED:
        return _CHECKED[model]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or not hasattr(model, "get_decoder"):
        return False
    ids = torch.tensor([[1, 2, 3, 4]], device=head.weight.device) % head.weight.shape[0]
    try:
        with eval_mode(model), torch.no_grad(), torch.autocast(head.weight.device.type, enabled=False):
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state[:, -1]
            own = model(input_ids=ids).logits[:, -1]
            matches = bool((head(hidden.to(head.weight.dtype)) - own).abs().max() <= 1e-4)
    except Exception:  # a decoder that needs more than input ids: keep the model's forward
        matches = False
    _CHECKED[model] = matches
    return matches
