"""Attention for the ``hf`` engine's decode steps: one query position over grouped KV heads, by matmul.

A decode step attends one new position per row to the whole KV cache. Through transformers'
``sdpa`` path that costs two avoidable things on a CPU: with a padding mask, the KV heads of a
grouped-query model are repeated (a copy of the cache, every layer, every step), and torch's
flash-attention CPU kernel is tuned for many query positions, not one. On the default model
(9 query heads over 3 KV heads, 32 rows, 100-200 cached positions, 2 threads; AMD EPYC Zen 4)
it took 2.5-5 ms a layer in bf16 and 1.0-3.3 ms in fp32, where the two matmuls below take
0.6-1.1 ms and 0.4-0.9 ms (``bench/decode_attention.py``). This path computes the core in float32
whatever the weights' dtype (the scores, the softmax, the weighted sum), so in bf16 it rounds
less than the kernel it replaces (which rounds the probabilities to bf16 before the second
product).

:func:`use_decode_attention` switches a model to it: the name :data:`NAME` is registered with
transformers' ``AttentionInterface`` (masks built as for ``sdpa``) and every call that is not a
plain one-position decode (a prefill, dropout, soft-capping, attention sinks, a position bias)
goes to ``sdpa`` unchanged. The engine applies it on a CPU, only to its own sampling copy of the weights,
never to the trainer's model.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "agentrl_decode"
"""The attention implementation's name in transformers' registries."""
UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias", "sliding_window")
"""Keyword arguments that, when set, send a call to ``sdpa``: this path implements none of them."""


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` (B, Hq, Q, D), ``key``/``value``
    (B, Hk, L, D), ``attention_mask`` None, bool (True: attend) or additive, (B or 1, 1, Q, L); returns
    the output (B, Q, Hq, D) and no weights. Q == 1 is computed here, anything else by ``sdpa``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = query.shape[2] == 1 and dropout == 0.0 and all(kwargs.get(name) is None for name in UNSUPPORTED)
    per_head_mask = attention_mask is not None and attention_mask.shape[1] != 1
    if not plain or per_head_mask or query.shape[1] % key.shape[1] != 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    rows, heads, _, dim = query.shape
    groups = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.reshape(rows, groups, heads // groups, dim).float()  # (B, Hk, G, D): G queries per KV head
    scores = torch.matmul(grouped, key.float().transpose(-1, -2)) * scale  # (B, Hk, G, L)
    if attention_mask is not None:
        mask = attention_mask[..., -key.shape[-2] :]  # (B or 1, 1, 1, L)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    weights = scores.softmax(dim=-1)  # (B, Hk, G, L)
    out = torch.matmul(weights, value.float())  # (B, Hk, G, D)
    return out.to(query.dtype).reshape(rows, 1, heads, dim), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` (a transformers model on ``sdpa``) to :func:`decode_attention`; whether it did.

    Models on another implementation (eager, flash, flex) or that cannot change it at run time
    keep theirs."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    config = getattr(model, "config", None)
    setter = getattr(model, "set_attn_implementation", None)
    if config is None or setter is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if not getattr(model, "_can_set_attn_implementation", lambda: False)():
        return False
    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    setter(NAME)
    return config._attn_implementation == NAME
