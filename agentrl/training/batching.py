"""How a rollout batch is cut: mini-batches (one optimizer step each) and micro-batches (one
forward/backward each, gradients accumulated), planned on row lengths alone."""

from __future__ import annotations

import torch

from agentrl.config.train import TrainConfig
from agentrl.model import distributed
from agentrl.trajectory import TrainBatch


def mini_batch_rows(num_rows: int, parts: int, seed: int, step: int, epoch: int) -> list[list[int]]:
    """Rows of ``parts`` mini-batches: all rows when ``parts`` is 1, else a seeded shuffle of the
    rows cut into ``parts`` near-equal parts (a new order each step and epoch)."""
    if parts == 1:
        return [list(range(num_rows))]
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + epoch)
    order = torch.randperm(num_rows, generator=generator)
    return [chunk.tolist() for chunk in torch.tensor_split(order, parts) if len(chunk)]


def split_to_count(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` split further, largest first, into ``count`` groups (each split halves a group in
    order, so every limit a group met still holds)."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        i = max(range(len(groups)), key=lambda j: len(groups[j]))
        if len(groups[i]) < 2:
            raise RuntimeError(
                f"cannot run {count} micro-batches on {sum(map(len, groups))} rows: under FSDP / ZeRO-3 "
                "every process needs as many rows as the process with the most micro-batches"
            )
        half = (len(groups[i]) + 1) // 2
        groups[i : i + 1] = [groups[i][:half], groups[i][half:]]
    return groups


def plan_micro_batches(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Split row indices into micro-batches for the padded forward, longest first, each with at most
    ``max_rows`` rows and ``rows x longest <= max_tokens`` padded tokens (a row longer than
    ``max_tokens`` alone)."""
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    plan: list[list[int]] = []
    longest = 0
    for row in order:
        current = plan[-1] if plan else None
        if current and len(current) < max_rows and (len(current) + 1) * max(longest, lengths[row]) <= max_tokens:
            current.append(row)
            longest = max(longest, lengths[row])
        else:
            plan.append([row])
            longest = lengths[row]
    return plan


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def plan_packed_micro_batches(rows: list[list[int]], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Split rows (their unpadded token ids) into micro-batches for the prefix-tree forward: at most
    ``max_rows`` rows, and at most ``max_tokens`` distinct tokens (the packed positions, each shared
    prefix counted once; a row longer than ``max_tokens`` goes alone).

    Rows are taken in lexicographic order of their tokens, so rows sharing a prefix sit together: a
    group's episodes (their prompt), an agent episode's segments (their conversation up to where the
    agent rewrote it), tasks with one system prompt. In that order a row's longest common prefix with
    any row before it is its common prefix with the row just before, so each row adds
    ``len(row) - shared`` positions to its micro-batch's tree."""
    order = sorted(range(len(rows)), key=lambda r: rows[r])
    plan: list[list[int]] = []
    size = 0
    for row in order:
        current = plan[-1] if plan else None
        grown = size + len(rows[row]) - (shared_prefix(rows[current[-1]], rows[row]) if current else 0)
        if current and len(current) < max_rows and grown <= max_tokens:
            current.append(row)
            size = grown
        else:
            plan.append([row])
            size = len(rows[row])
    return plan


def micro_batch_rows(batch: TrainBatch, config: TrainConfig, packed: bool, sharded: bool) -> list[list[int]]:
    """``batch``'s row groups within ``micro_batch_size`` and ``micro_batch_tokens``: padded rows
    longest first (:func:`plan_micro_batches`), or for a ``packed`` forward rows sharing prefixes
    together and tokens counted once (:func:`plan_packed_micro_batches`); with ``sharded`` weights as
    many groups on every process (each forward gathers the shards: a collective)."""
    if packed:
        ids = [row[:length] for row, length in zip(batch.input_ids.tolist(), batch.lengths.tolist())]
        plan = plan_packed_micro_batches(ids, config.micro_batch_size, config.micro_batch_tokens)
    else:
        plan = plan_micro_batches(batch.lengths.tolist(), config.micro_batch_size, config.micro_batch_tokens)
    if not sharded:
        return plan
    return split_to_count(plan, max(distributed.gather_objects(len(plan))))
