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


def plan_micro_batches(
    lengths: list[int], max_rows: int, max_tokens: int, groups: list[int] | None = None
) -> list[list[int]]:
    """Split row indices into micro-batches, longest first, each with at most ``max_rows`` rows and
    ``rows x longest <= max_tokens`` padded tokens (a row longer than ``max_tokens`` alone).

    With ``groups`` (the rows' GRPO group ids, for packed forwards) rows of a group stay together:
    group by group, longest first within each, so a micro-batch shares its prompt."""
    if groups is None:
        order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    else:
        order = sorted(range(len(lengths)), key=lambda r: (groups[r], -lengths[r]))
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


def micro_batch_rows(batch: TrainBatch, config: TrainConfig, packed: bool, sharded: bool) -> list[list[int]]:
    """``batch``'s row groups, longest rows first, within ``micro_batch_size`` and
    ``micro_batch_tokens`` (``packed``: a micro-batch per group, :func:`plan_micro_batches`); with
    ``sharded`` weights as many groups on every process (each forward gathers the shards: a collective)."""
    groups = batch.groups.tolist() if packed else None
    plan = plan_micro_batches(batch.lengths.tolist(), config.micro_batch_size, config.micro_batch_tokens, groups)
    if not sharded:
        return plan
    return split_to_count(plan, max(distributed.gather_objects(len(plan))))
