"""What a rollout batch's optimizer steps log: token means, per-step scalars, over processes."""

from __future__ import annotations

from typing import Any

import torch


class StepStats:
    """Metrics of a rollout batch's optimizer steps: token statistics as loss-mask-weighted means
    over all of them, scalars summed within an optimizer step and averaged over the steps. Over
    several processes, token sums and scalars add up (each process's loss is its share of the
    global loss) except ``shared`` scalars, the same on every process (grad norm, learning rate)."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[float]] = {}
        self.scalars: dict[str, float] = {}
        self.current: dict[str, float] = {}
        self.shared: set[str] = set()
        self.steps = 0

    def add_tokens(self, key: str, value: torch.Tensor, mask: torch.Tensor) -> None:
        """Add ``value`` ``(n, T)`` weighted by ``mask`` ``(n, T)``."""
        num, den = self.tokens.get(key, (0.0, 0.0))
        self.tokens[key] = [num + float((value * mask).sum()), den + float(mask.sum())]

    def add_scalar(self, key: str, value: float, shared: bool = False) -> None:
        """Add ``value`` to this optimizer step's sum for ``key`` (``shared``: every process
        logs the same value, so processes do not add up)."""
        self.current[key] = self.current.get(key, 0.0) + value
        if shared:
            self.shared.add(key)

    def end_step(self) -> None:
        """Close one optimizer step."""
        for key, value in self.current.items():
            self.scalars[key] = self.scalars.get(key, 0.0) + value
        self.current, self.steps = {}, self.steps + 1

    def means(self, combine: Any = None) -> dict[str, float]:
        """Name -> value over all closed optimizer steps; ``combine`` gathers every process's
        ``(tokens, scalars)`` (``distributed.gather_objects``) to report the whole batch's."""
        tokens, scalars = dict(self.tokens), dict(self.scalars)
        parts = combine((self.tokens, self.scalars)) if combine is not None else [(tokens, scalars)]
        if len(parts) > 1:
            tokens = {k: [sum(p[0][k][i] for p in parts if k in p[0]) for i in (0, 1)] for k in tokens}
            scalars = {k: v if k in self.shared else sum(p[1].get(k, 0.0) for p in parts) for k, v in scalars.items()}
        out = {key: value / max(self.steps, 1) for key, value in scalars.items()}
        out.update({key: num / max(den, 1.0) for key, (num, den) in tokens.items()})
        return out
