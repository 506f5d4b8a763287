"""Several training processes (``accelerate launch``): who does what, and global sums.

A multi-process run splits each rollout batch by whole groups: process ``r`` of ``N`` rolls out
groups ``r*k .. r*k+k-1`` of the step's ``prompts_per_step = N*k`` (a group never straddles two
processes, so group statistics stay local and exact). Everything that must be a statistic of
the *whole* batch goes through :func:`all_sum`: loss denominators (``LossContext.totals``), batch
reward scaling, advantage whitening. Only the main process evaluates, logs, writes the run dir and
saves. Single-process runs (no process group) pay nothing: every function here is the identity.

Plugins use :func:`all_sum` for their own batch-wide statistics (a mean over the batch is
``all_sum(sum) / all_sum(count)``); it must be called by every process the same number of times.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """How many training processes this run has (1 without a process group)."""
    return dist.get_world_size() if _active() else 1


def rank() -> int:
    """This process's index in ``[0, world_size())`` (0 without a process group)."""
    return dist.get_rank() if _active() else 0


def is_main() -> bool:
    """Whether this process evaluates, logs and writes the run dir."""
    return rank() == 0


def all_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over all processes (a new tensor; every process gets the sum). Float64
    tensors travel as float64, so sums of counts stay exact."""
    if not _active():
        return tensor.clone()
    out = tensor.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def gather_objects(obj: T, group: Any = None) -> list[T]:
    """Every process's ``obj`` (picklable), in rank order, on every process (``group``: a process
    group of its own, e.g. a background thread's; None: the default one)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


def new_group() -> Any:
    """A process group of every process over gloo, for collectives of a thread beside the main one
    (every process calls it, in the same order); None in a one-process run."""
    return dist.new_group(backend="gloo") if _active() else None


def broadcast_object(obj: T) -> T:
    """The main process's ``obj`` on every process."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait until every process gets here."""
    if _active():
        dist.barrier()
