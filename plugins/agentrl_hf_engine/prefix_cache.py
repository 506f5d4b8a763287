"""The ``hf`` engine's prefix cache: finished sequences' KV kept across ``generate`` calls.

Every sequence a decode finishes leaves its KV behind (the prompt and every sampled token but the
last, which was never fed), keyed by those token ids. A later prompt that starts with any stored
sequence's ids (turn k+1 of an episode extends turn k; an agent's next call extends its last; a
GRPO group's next call repeats the prompt) takes the longest common prefix's KV and prefills only
the rest. Entries are evicted least recently used first once their KV passes the byte budget
(``engine_args.prefix_cache_mb``). The KV belongs to one set of weights: the engine clears the
cache on ``sync_weights`` and whenever ``before_decode_step`` reports another policy version.

Keys keep RoPE's rotation of their absolute positions 0..L-1; a hit is placed in the batch with the
same positions (``cumsum(mask) - 1``), its row left-padded to the batch's longest hit and the
suffix after it left-padded again, the padding masked out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, one sequence's keys and values, each (H_kv, L, D)."""


@dataclass
class _Entry:
    """One stored sequence: its ids (L,) on the CPU, its KV and the bytes that KV holds."""

    ids: torch.Tensor
    kv: KV
    nbytes: int


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading ids the 1-d tensors ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differs = (a[:n] != b[:n]).nonzero()
    return int(differs[0, 0]) if len(differs) else n


def shared_start(prompts: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The ids every one of ``prompts`` begins with (the lexicographically least and greatest
    prompts share exactly what all of them share)."""
    first, last = min(prompts), max(prompts)
    return first[: common_prefix(torch.tensor(first, dtype=torch.long), torch.tensor(last, dtype=torch.long))]


class PrefixCache:
    """Finished sequences' KV keyed by their token ids, least recently used evicted past ``budget``
    bytes; every entry computed with the weights of policy ``version`` (None: unknown)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.nbytes = 0
        self.version: int | None = None
        self._next_key = 0

    def clear(self, version: int | None = None) -> None:
        """Drop every entry (new weights); later entries belong to ``version``."""
        self.entries.clear()
        self.nbytes = 0
        self.version = version

    def use_version(self, version: int | None) -> None:
        """Clear the cache when ``version`` is not the one its entries were computed with."""
        if version != self.version:
            self.clear(version)

    def lookup(self, prompt: list[int]) -> tuple[int, KV | None]:
        """The longest stored prefix of ``prompt`` (at most ``len(prompt) - 1`` ids: the last is
        prefilled for its logits) and its KV, sliced to it; ``(0, None)`` on a miss."""
        ids = torch.tensor(prompt)
        best, found = 0, None
        for key, entry in self.entries.items():
            shared = min(common_prefix(ids, entry.ids), len(prompt) - 1)
            if shared > best:
                best, found = shared, key
        if found is None:
            return 0, None
        self.entries.move_to_end(found)  # recently used
        return best, [(k[:, :best], v[:, :best]) for k, v in self.entries[found].kv]

    def store(self, ids: list[int], kv: KV) -> None:
        """Keep ``kv``, the KV of ``ids``; an entry whose ids start ``ids`` is replaced, and ``ids``
        already covered by an entry is only marked used."""
        key = torch.tensor(ids)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.budget:
            return
        for name, entry in list(self.entries.items()):
            shared = common_prefix(key, entry.ids)
            if shared == len(key):  # already covered
                self.entries.move_to_end(name)
                return
            if shared == len(entry.ids):  # the new one extends it
                self._drop(name)
        self.entries[self._next_key] = _Entry(key, kv, nbytes)
        self._next_key += 1
        self.nbytes += nbytes
        while self.nbytes > self.budget:
            self._drop(next(iter(self.entries)))

    def _drop(self, name: int) -> None:
        self.nbytes -= self.entries.pop(name).nbytes


def batch_cache(cache: Any, hits: list[tuple[int, KV | None]], width: int) -> Any:
    """``cache`` (empty) filled with ``width`` positions per row holding each row's hit
    right-aligned (zeros, masked out, to its left): the past of a prefill that feeds only the
    uncached suffixes."""
    template = next(kv for _, kv in hits if kv is not None)
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(hits), k0.shape[0], width, k0.shape[2]))  # (U, H, width, D)
        values = v0.new_zeros((len(hits), v0.shape[0], width, v0.shape[2]))
        for row, (length, kv) in enumerate(hits):
            if kv is not None and length:
                keys[row, :, width - length :] = kv[layer][0]
                values[row, :, width - length :] = kv[layer][1]
        cache.update(keys, values, layer)
    return cache


def row_kv(cache: Any, row: int, real: torch.Tensor) -> KV:
    """Row ``row``'s KV at the positions ``real`` (a bool mask over the cache's length) marks, copied."""
    return [(layer.keys[row][:, real].clone(), layer.values[row][:, real].clone()) for layer in cache.layers]


def only_full_attention(config: Any) -> bool:
    """Whether every layer of the model's cache is a plain full-attention layer (a sliding window
    or a recurrent state cannot be sliced by position; such models run without the prefix cache)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)
