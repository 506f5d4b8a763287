"""Which engine replica samples each prompt (:class:`PrefixRouter`): a conversation stays on the
replica that holds its prefix, new ones go to the least-loaded replica.

Routing never changes what is sampled (every replica holds the same weights and each prompt brings
its own seed): it only decides where an engine's prefix cache (vLLM's) can be reused. A wrong guess,
a hash collision included, costs a prefill, nothing else.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

_MOD = (1 << 61) - 1  # a Mersenne prime: the rolling hash's modulus
_BASE = 1_000_003


def prefix_hashes(ids: Sequence[int]) -> list[int]:
    """``out[n]``: a 61-bit polynomial hash of ``ids[:n]`` (``out[0]`` of the empty prefix), all in
    one pass over ``ids``."""
    out = [0]
    value = 0
    for token in ids:
        value = (value * _BASE + int(token) + 1) % _MOD
        out.append(value)
    return out


class PrefixRouter:
    """Remembers, for each routed sequence (prompt + completion), the replica that sampled it, and
    sends a later prompt that starts with the longest remembered sequence to that replica; a prompt
    no remembered sequence prefixes goes to the replica with the fewest prompts in the call.

    At most ``capacity`` sequences are remembered (the oldest are forgotten first); :meth:`forget`
    drops them all (new weights: the replicas' prefix caches are reset).
    """

    def __init__(self, replicas: int, capacity: int = 65536) -> None:
        self.replicas, self.capacity = replicas, capacity
        self.seen: OrderedDict[tuple[int, int], int] = OrderedDict()
        """(length, hash of the sequence) -> the replica that sampled it."""
        self.lengths: dict[int, int] = {}
        """Length -> how many remembered sequences have it (the lengths worth looking up)."""

    def route(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        """The replica of each prompt (a conversation's later turn: its earlier turn's replica;
        the others: the least-loaded replica so far in this call, lowest index first)."""
        load = [0] * self.replicas
        chosen: list[int | None] = [self._known(prompt) for prompt in prompts]
        for replica in chosen:
            if replica is not None:
                load[replica] += 1
        routes = []
        for replica in chosen:
            if replica is None:
                replica = min(range(self.replicas), key=lambda r: (load[r], r))
                load[replica] += 1
            routes.append(replica)
        return routes

    def remember(self, sequence: Sequence[int], replica: int) -> None:
        """``sequence`` (prompt + completion) was sampled on ``replica``."""
        key = (len(sequence), prefix_hashes(sequence)[-1])
        if key in self.seen:
            self.seen.move_to_end(key)
        else:
            self.lengths[key[0]] = self.lengths.get(key[0], 0) + 1
        self.seen[key] = replica
        while len(self.seen) > self.capacity:
            (length, _), _ = self.seen.popitem(last=False)
            self.lengths[length] -= 1
            if not self.lengths[length]:
                del self.lengths[length]

    def forget(self) -> None:
        """Drop every remembered sequence."""
        self.seen.clear()
        self.lengths.clear()

    def _known(self, prompt: Sequence[int]) -> int | None:
        """The replica of the longest remembered sequence that ``prompt`` starts with, if any."""
        if not self.seen:
            return None
        hashes = prefix_hashes(prompt)
        for length in sorted((n for n in self.lengths if n <= len(prompt)), reverse=True):
            replica = self.seen.get((length, hashes[length]))
            if replica is not None and replica < self.replicas:
                return replica
        return None
