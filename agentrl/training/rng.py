"""Every global random generator's state, captured and restored (checkpoints, step boundaries)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_states() -> dict[str, Any]:
    """Every global random generator's state (Python, numpy, torch CPU and CUDA), as values
    :func:`agentrl.rundir.state_files.to_json` stores exactly."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` captured (also after a JSON round trip, or an earlier
    agentrl's pickled form)."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
