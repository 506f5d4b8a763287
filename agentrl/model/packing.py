"""Prefix-tree packing: a micro-batch's rows as one sequence in which shared prefixes appear once.

A GRPO group's episodes share their prompt (and often their first sampled tokens); a padded
batch computes that prompt once per row and pushes padding through the backward. Packed, every
distinct prefix is one position of a single sequence: the rows are inserted into a trie, each
trie node (a token after a given prefix) becomes one position, its ``position_id`` is its depth
(the token's index in its rows) and it attends exactly to its ancestors and itself. The hidden
state at a node is then the one every row through it would compute alone (same tokens, same
positions, same causal context), so logprobs agree with the padded forward to float rounding,
and a shared node's gradient is the sum of its rows' (autograd adds up repeated gathers).

``node_index[n, t]`` says where row ``n``'s token ``t`` lives in the packed sequence (-1 on
padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedRows:
    """Rows packed into one prefix-tree sequence of L positions (N rows, T padded columns)."""

    input_ids: torch.Tensor  # (1, L) long
    position_ids: torch.Tensor  # (1, L) long: depth of each node
    attend: torch.Tensor  # (1, 1, L, L) bool: query position attends key position (ancestors and itself)
    node_index: torch.Tensor  # (N, T) long: packed position of row n's token t, -1 on padding
    parents: tuple[int, ...]  # each position's parent position, -1 for a root

    @property
    def length(self) -> int:
        """L, the packed positions (distinct prefixes)."""
        return int(self.input_ids.shape[1])


def pack_prefix_tree(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows:
    """Pack right-padded rows ``(N, T)`` (``attention_mask`` 1 on real tokens) into a prefix tree."""
    ids = input_ids.tolist()
    lengths = attention_mask.sum(dim=1).tolist()
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node; parent -1 is the root
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    node_index = torch.full(input_ids.shape, -1, dtype=torch.long)
    for n, (row, length) in enumerate(zip(ids, lengths)):
        parent = -1
        for t in range(int(length)):
            key = (parent, row[t])
            node = children.get(key)
            if node is None:
                node = children[key] = len(tokens)
                tokens.append(row[t])
                parents.append(parent)
                depths.append(t)
            node_index[n, t] = node
            parent = node
    size = len(tokens)
    attend = torch.zeros(size, size, dtype=torch.bool)
    # Nodes are created after their parent, so a node's ancestors are its parent's ancestors plus
    # the parent: fill rows in creation order.
    for node, parent in enumerate(parents):
        if parent >= 0:
            attend[node] = attend[parent]
        attend[node, node] = True
    device = input_ids.device
    return PackedRows(
        input_ids=torch.tensor([tokens], dtype=torch.long, device=device),
        position_ids=torch.tensor([depths], dtype=torch.long, device=device),
        attend=attend[None, None].to(device),
        node_index=node_index.to(device),
        parents=tuple(parents),
    )
