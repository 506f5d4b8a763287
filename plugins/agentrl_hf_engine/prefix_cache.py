"""The ``hf`` engine's prefix cache: finished sequences' KV kept across ``generate`` calls.

Every sequence a decode finishes leaves its KV behind (the prompt and every sampled token but the
last, which was never fed) in a radix tree keyed by token ids, where a prefix several sequences
share is held once. A later prompt that starts with stored ids (turn k+1 of an episode extends turn
k; an agent's next call extends its last; a GRPO group's next call repeats the prompt; every
episode shares a system prompt) takes the longest stored prefix's KV and prefills only the rest.
Leaves are evicted least recently used first once the tree's KV passes the byte budget
(``engine_args.prefix_cache_mb``). The KV belongs to one set of weights: the engine clears the
cache on ``sync_weights`` and whenever ``before_decode_step`` reports another policy version.

Keys keep RoPE's rotation of their absolute positions 0..L-1; a hit is placed in the batch with the
same positions (``cumsum(mask) - 1``), its row left-padded to the batch's longest hit and the
suffix after it left-padded again, the padding masked out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, one sequence's keys and values, each (H_kv, L, D)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids the id sequences ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):  # the common case, compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])


def shared_start(prompts: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The ids every one of ``prompts`` begins with (the lexicographically least and greatest
    prompts share exactly what all of them share)."""
    first, last = min(prompts), max(prompts)
    return first[: common_prefix(first, last)]


def _kv_bytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def _slice(kv: KV, start: int, stop: int | None = None) -> KV:
    """Positions ``start:stop`` of ``kv``, copied (a kept slice never pins the tensor it came from)."""
    return [(k[:, start:stop].clone(), v[:, start:stop].clone()) for k, v in kv]


@dataclass(eq=False)
class _Node:
    """One edge of the radix tree: the ids ``ids`` that follow the parent's, their KV, the
    children keyed by their first id, and when the node was last on a looked-up or stored path."""

    ids: tuple[int, ...]
    kv: KV
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    used: int = 0

    @property
    def nbytes(self) -> int:
        return _kv_bytes(self.kv)


class PrefixCache:
    """Finished sequences' KV in a radix tree over their token ids: a prefix that several sequences
    share (a system prompt, a GRPO group's prompt, an episode's earlier turns) is held once. Leaves
    are evicted least recently used first past ``budget`` bytes; every node was computed with the
    weights of policy ``version`` (None: unknown)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.nbytes = 0
        self.version: int | None = None
        self._root = _Node((), [], None)
        self._clock = 0

    def clear(self, version: int | None = None) -> None:
        """Drop every sequence (new weights); later ones belong to ``version``."""
        self._root = _Node((), [], None)
        self.nbytes = 0
        self.version = version

    def use_version(self, version: int | None) -> None:
        """Clear the cache when ``version`` is not the one its sequences were computed with."""
        if version != self.version:
            self.clear(version)

    def sequences(self) -> list[tuple[int, ...]]:
        """The ids of every stored sequence (a leaf's path), least recently used first."""
        return [self._path_ids(leaf) for leaf in sorted(self._leaves(), key=lambda node: node.used)]

    def lookup(self, prompt: list[int]) -> tuple[int, KV | None]:
        """The longest stored prefix of ``prompt`` (at most ``len(prompt) - 1`` ids: the last is
        prefilled for its logits) and its KV; ``(0, None)`` on a miss."""
        path = self._walk(prompt[: len(prompt) - 1])
        length = sum(taken for _, taken in path)
        if not length:
            return 0, None
        if len(path) == 1:  # one node: views of its KV, no copy (the batch's cache copies them in)
            node, taken = path[0]
            return length, [(k[:, :taken], v[:, :taken]) for k, v in node.kv]
        layers = zip(*(node.kv for node, _ in path), strict=True)  # per layer, each node's (k, v)
        kv = [
            (
                torch.cat([k[:, :t] for (k, _), (_, t) in zip(kvs, path)], 1),
                torch.cat([v[:, :t] for (_, v), (_, t) in zip(kvs, path)], 1),
            )
            for kvs in layers
        ]
        return length, kv

    def store(self, ids: list[int], kv: KV) -> None:
        """Keep ``kv``, the KV of ``ids`` (views are fine: what is kept is copied): the part of
        ``ids`` the tree already holds is only marked used, the rest added as a new leaf."""
        if len(ids) == 0 or _kv_bytes(kv) > self.budget:
            return
        path = self._walk(ids)
        held = sum(taken for _, taken in path)
        if held < len(ids):
            node = self._root
            if path:
                node, taken = path[-1]
                if taken < len(node.ids):
                    node = self._split(node, taken)
            leaf = _Node(tuple(ids[held:]), _slice(kv, held), node, used=self._tick())
            node.children[leaf.ids[0]] = leaf
            self.nbytes += leaf.nbytes
        while self.nbytes > self.budget:
            self._evict()

    def _walk(self, ids: Sequence[int]) -> list[tuple[_Node, int]]:
        """The nodes ``ids`` runs through from the root, each with how many of its ids match
        (all but possibly the last node's), marked used."""
        path, node, at, now = [], self._root, 0, self._tick()
        while at < len(ids) and (child := node.children.get(ids[at])) is not None:
            taken = common_prefix(child.ids, ids[at : at + len(child.ids)])
            child.used = now
            path.append((child, taken))
            at += taken
            if taken < len(child.ids):
                break
            node = child
        return path

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node`` after its first ``at`` ids; the upper part (returned) takes its place."""
        upper = _Node(node.ids[:at], _slice(node.kv, 0, at), node.parent, used=node.used)
        node.parent.children[upper.ids[0]] = upper
        node.ids, node.kv, node.parent = node.ids[at:], _slice(node.kv, at), upper
        upper.children[node.ids[0]] = node
        return upper

    def _evict(self) -> None:
        """Drop the least recently used leaf."""
        leaf = min(self._leaves(), key=lambda node: node.used)
        del leaf.parent.children[leaf.ids[0]]
        self.nbytes -= leaf.nbytes

    def _leaves(self) -> list[_Node]:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children:
                leaves.append(node)
        return leaves

    def _path_ids(self, node: _Node) -> tuple[int, ...]:
        parts = []
        while node is not self._root:
            parts.append(node.ids)
            node = node.parent
        return tuple(id_ for part in reversed(parts) for id_ in part)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock


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
    return [(layer.keys[row][:, real], layer.values[row][:, real]) for layer in cache.layers]  # indexing copies


def only_full_attention(config: Any) -> bool:
    """Whether every layer of the model's cache is a plain full-attention layer (a sliding window
    or a recurrent state cannot be sliced by position; such models run without the prefix cache)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)
