"""Learning-rate schedules of the trained modules (transformers' schedules, plus wsd and resume)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from transformers import get_scheduler

from agentrl.config.train import TrainConfig


def reapply_schedule(scheduler: Any) -> None:
    """Set each group's rate to what the schedule gives at its current step. A loaded state keeps
    the rate it was saved with, which for a run resumed with more steps is the old schedule's."""
    scheduler.last_epoch -= 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "step() before optimizer.step()": no update here
        scheduler.step()


def wsd_decay_steps(fraction: float, steps_after_warmup: int) -> int:
    """Optimizer steps of the wsd decay: ``fraction`` of the steps after warm-up, rounded, at least
    one and at most all of them (0.375 of 40 is 15). ``fraction`` is ``TrainConfig.lr_decay_fraction``,
    whose range, (0, 1], the config checks when it is built (its only check: a user's value never
    gets here unchecked); a caller that passes another number gets the same clamp, one step or all."""
    return min(max(1, round(fraction * steps_after_warmup)), max(1, steps_after_warmup))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    name: str,
    warmup_steps: int,
    total_steps: int,
    decay_fraction: float = TrainConfig.lr_decay_fraction,
) -> Any:
    """A transformers LR schedule; ``constant`` with warm-up is ``constant_with_warmup`` (the plain
    ``constant`` schedule ignores ``num_warmup_steps``); ``wsd`` is transformers' warm-up, stable,
    decay schedule, decaying linearly to 0 over :func:`wsd_decay_steps` of the steps."""
    if name == "constant" and warmup_steps > 0:
        name = "constant_with_warmup"
    if name == "wsd":
        decay_steps = wsd_decay_steps(decay_fraction, total_steps - warmup_steps)
        return get_scheduler(
            "warmup_stable_decay",
            optimizer,
            num_warmup_steps=warmup_steps,
            num_training_steps=total_steps,
            scheduler_specific_kwargs={"num_decay_steps": decay_steps, "decay_type": "linear"},
        )
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)
