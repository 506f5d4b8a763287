"""Checkpoint files that never run code when read (docs/concepts/guards.md#checkpoints): tensors through
``torch.save`` /
``torch.load(weights_only=True)``, everything else as JSON with tensors inlined as base64.

``torch.load(weights_only=False)`` unpickles arbitrary objects, so a checkpoint swapped by someone
else could run any code; ``weights_only=True`` builds tensors and plain containers only and refuses
the rest by name. Values that are not tensors (RNG states, schedules, plugin state) go to JSON,
which cannot hold code at all.
"""

from __future__ import annotations

import base64
import contextlib
import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import CheckpointError, one_line

_TENSOR = "__tensor__"


def save_tensors(value: Any, path: Path) -> None:
    """``torch.save`` through a Python file, so that a failed write surfaces as its OSError (disk
    full) rather than torch's "unexpected pos" RuntimeError."""
    with path.open("wb") as f:
        torch.save(value, f)


def save_json(value: Any, path: Path) -> None:
    """Write ``value`` (JSON values and tensors, see :func:`to_json`) to ``path`` as JSON."""
    path.write_text(json.dumps(to_json(value, path.name)))


def load_tensors(path: Path, allow: list[Any] | None = None) -> Any:
    """A ``torch.save`` file read with ``weights_only=True`` (tensors and plain values; ``allow``:
    further types); a CheckpointError naming the file when it is unreadable or refers to anything
    else (pickled code, which is never run)."""
    allowed = getattr(torch.serialization, "safe_globals", None)
    try:
        with allowed(allow) if allow and allowed else contextlib.nullcontext():
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL (\S+)|got <class '([^']+)'>", str(exc))
        what = f" ({next(g for g in named.groups() if g)})" if named else ""
        raise CheckpointError(
            f"{path} holds pickled objects beyond tensors and plain values{what}, which could run "
            "code when loaded: agentrl loads checkpoints with weights_only=True and refused it; "
            "resume from a checkpoint you trust, or start the run again"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is unreadable ({one_line(exc)}): resume from another checkpoint, or start the run again"
        ) from None


def to_json(value: Any, where: str) -> Any:
    """``value`` as JSON data: dicts (string keys), lists and tuples (as lists), numbers, strings,
    None; tensors as ``{"__tensor__": {"dtype", "shape", "data" (base64)}}``. Anything else is a
    CheckpointError naming where in ``where`` it is."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        return {
            _TENSOR: {
                "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape),
                "data": base64.b64encode(flat.view(torch.uint8).numpy().tobytes()).decode("ascii"),
            }
        }
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str) or key == _TENSOR:
                raise CheckpointError(
                    f"{where}: key {key!r} cannot be stored in a checkpoint (string keys other than {_TENSOR!r} only)"
                )
        return {key: to_json(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CheckpointError(
        f"{where}: a {type(value).__name__} cannot be stored in a checkpoint (JSON values and tensors only)"
    )


def from_json(value: Any) -> Any:
    """Undo :func:`to_json` (tuples come back as lists, tensors on the CPU)."""
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            return _tensor(value[_TENSOR])
        return {key: from_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json(item) for item in value]
    return value


def _tensor(spec: Any) -> torch.Tensor:
    """The tensor :func:`to_json` stored as ``spec``; a CheckpointError when it is malformed."""
    try:
        dtype = getattr(torch, str(spec["dtype"]))
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {spec['dtype']!r}")
        raw = bytearray(base64.b64decode(spec["data"], validate=True))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(spec["shape"]).clone()
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"a stored tensor is malformed ({one_line(exc)})") from None
