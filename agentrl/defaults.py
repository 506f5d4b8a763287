"""The core's own step-hook implementations, registered as the plugin ``agentrl.defaults``.

They are ordinary hookimpls: the firstresult default is ``trylast`` so any plugin replaces it,
and the loss-mask adjustment does nothing unless its config switch is on.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.objectives import importance_log_weights
from agentrl.hookspecs import hookimpl
from agentrl.trajectory import TrainBatch


@hookimpl(trylast=True)
def agentrl_importance_weights(log_ratio: torch.Tensor, loss_mask: torch.Tensor, level: str) -> torch.Tensor:
    """Importance weights at the algorithm's level: token (PPO, GRPO), sequence (GSPO) or
    sequence_token (GSPO-token); see :func:`agentrl.algorithms.objectives.importance_log_weights`."""
    return importance_log_weights(log_ratio, loss_mask, level)


@hookimpl
def agentrl_adjust_loss_mask(batch: TrainBatch, config: Any, metrics: dict[str, float]) -> torch.Tensor | None:
    """Drop truncated episodes from the loss when ``config.mask_truncated_completions`` is on
    (DAPO's overlong filtering); returns ``(N, T)`` 0/1 or None when off.

    Logs ``mask/frac_truncated``: a value near 1 means the length caps are too small and almost
    nothing is trained on (docs/concepts/guards.md#truncated-episodes).
    """
    if not config.mask_truncated_completions:
        return None
    truncated = batch.truncated.to(device=batch.loss_mask.device, dtype=torch.bool)  # (N,)
    metrics["mask/frac_truncated"] = float(truncated.float().mean().item()) if len(truncated) else 0.0
    keep = (~truncated).to(batch.loss_mask.dtype)  # (N,)
    return keep[:, None].expand_as(batch.loss_mask).clone()  # (N, T)
