"""The ``hf`` engine's KV cache that grows in place instead of by concatenation.

transformers' ``DynamicCache`` grows by ``torch.cat`` on every step: step t copies the whole cache
of t - 1 positions, every layer, into freshly allocated memory. :class:`GrowingCache` keeps each
layer's keys and values in a buffer with room for ``reserve`` more positions than its first write
(the engine reserves ``max_new_tokens``, at most 256, so a short decode never grows it); a step writes its position in
place and the layer exposes views of the filled part (``layer.keys``/``layer.values``, as
``DynamicLayer`` does). A write past the room doubles the buffer; dropping rows
(``batch_select_indices``) copies only the kept rows' filled part.

The other per-step copy of a grouped-query model (sdpa's ``repeat_kv`` of the KV heads whenever a
mask is passed) is avoided by the engine's decode attention
(:mod:`agentrl_hf_engine.decode_attention`), which reads these views as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A full-attention layer whose keys and values (B, H, L, D) are views into a buffer with spare
    positions: ``update`` writes in place (no ``torch.cat``), doubling the buffer when it is full."""

    def __init__(self, reserve: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reserve = reserve
        self.length = 0
        self.key_store: torch.Tensor | None = None  # (B, H, capacity, D)
        self.value_store: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        """Positions the buffer holds before it has to grow (0 before the first write)."""
        return 0 if self.key_store is None else self.key_store.shape[-2]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states``/``value_states`` (B, H, N, D) after the filled positions; return
        views (B, H, L + N, D) of everything filled."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if self.key_store is None:
            self.key_store = self._empty(key_states, end + self.reserve)
            self.value_store = self._empty(value_states, end + self.reserve)
        elif end > self.capacity:
            self._resize(max(end, 2 * self.capacity))
        assert self.value_store is not None  # set with key_store
        self.key_store[:, :, self.length : end] = key_states
        self.value_store[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (in that order, repeats allowed): their filled part is copied
        into a buffer of the same capacity."""
        if self.key_store is None or self.value_store is None:
            return
        self.key_store = self._moved(self.key_store, self.capacity, indices)
        self.value_store = self._moved(self.value_store, self.capacity, indices)
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times in place of it."""
        if self.key_store is not None:
            rows = torch.arange(self.key_store.shape[0], device=self.key_store.device)
            self.batch_select_indices(rows.repeat_interleave(repeats))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the rows (beam search): the same as keeping ``beam_idx``."""
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (negative), or keep the first
        ``tokens_to_remove`` (positive, transformers' older form)."""
        keep = tokens_to_remove if tokens_to_remove > 0 else self.length + tokens_to_remove
        if self.key_store is not None and 0 <= keep < self.length:
            self.length = keep
            self._expose()

    def reset(self) -> None:
        """Drop the buffer (the next write allocates again)."""
        self.key_store = self.value_store = None
        self.length = 0
        super().reset()

    def _resize(self, capacity: int) -> None:
        """Move the filled part into a buffer of ``capacity`` positions."""
        assert self.key_store is not None and self.value_store is not None
        self.key_store = self._moved(self.key_store, capacity)
        self.value_store = self._moved(self.value_store, capacity)

    def _moved(self, store: torch.Tensor, capacity: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """A new buffer of ``capacity`` positions holding ``store``'s filled part (of ``rows``)."""
        filled = store[:, :, : self.length]
        if rows is not None:
            filled = filled.index_select(0, rows.to(store.device))
        fresh = store.new_empty((filled.shape[0], store.shape[1], capacity, store.shape[3]))
        fresh[:, :, : self.length] = filled
        return fresh

    @staticmethod
    def _empty(like: torch.Tensor, capacity: int) -> torch.Tensor:
        """An uninitialised buffer shaped like ``like`` (B, H, N, D) with ``capacity`` positions."""
        return like.new_empty((like.shape[0], like.shape[1], capacity, like.shape[3]))

    def _expose(self) -> None:
        """Point ``keys``/``values`` at the filled part of the buffers."""
        assert self.key_store is not None and self.value_store is not None
        self.keys = self.key_store[:, :, : self.length]
        self.values = self.value_store[:, :, : self.length]


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of :class:`GrowingLayer`\\ s, one per decoder layer of ``config``, each
    with room for ``reserve`` positions past its first write. For full-attention models only
    (:func:`new_cache` picks)."""

    def __init__(self, config: Any, reserve: int = 0) -> None:
        layers = config.get_text_config(decoder=True).num_hidden_layers
        Cache.__init__(self, layers=[GrowingLayer(reserve) for _ in range(layers)])


def new_cache(config: Any, reserve: int, grows: bool) -> Any:
    """An empty KV cache for a model with ``config``: a :class:`GrowingCache` reserving ``reserve``
    positions when ``grows`` (every layer full attention), else transformers' ``DynamicCache``."""
    return GrowingCache(config, reserve) if grows else DynamicCache(config=config)
