"""What a checkpoint saved, read back without running code from it: the trainer state, the
algorithm's modules, the optimizers, schedules, each process's RNG and engine state
(:func:`read_checkpoint`), and where the policy's weights are (:func:`weights_folder`). The
folders, their manifest and how they are written: :mod:`agentrl.rundir.checkpoints`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.errors import CheckpointError, ConfigError, one_line
from agentrl.rundir.checkpoints import (
    EXTRA,
    LEGACY_EXTRA,
    MODULES,
    OPTIMIZERS,
    STATE,
    WEIGHTS,
    read_json,
    read_manifest,
)
from agentrl.rundir.state_files import from_json, load_tensors


@dataclass
class Saved:
    """What a checkpoint holds, read without running code from it."""

    trainer: dict[str, Any]  # trainer_state.json
    modules: dict[str, Any]  # name -> state dict of an algorithm-owned module
    optimizers: dict[str, Any]  # name -> optimizer state dict; None where not kept (a finished run's)
    schedules: dict[str, Any]  # name -> LR schedule state
    processes: list[dict[str, Any]]  # each process's {"rng", "engine", "async"} state
    algorithm: dict[str, Any]
    plugins: dict[str, Any]


def read_checkpoint(folder: Path) -> Saved:
    """Everything in checkpoint ``folder`` but the policy's weights (:func:`weights_folder`); a
    CheckpointError naming the file that cannot be read, or would run code to load."""
    try:
        manifest = read_manifest(folder)
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint {str(folder)!r}: {exc}") from None
    trainer = read_json(folder / STATE)
    modules = load_tensors(folder / MODULES)
    try:
        if manifest is None:
            return _read_legacy(folder, trainer, modules)
        extra = from_json(read_json(folder / EXTRA))
        optim = load_tensors(folder / OPTIMIZERS) if OPTIMIZERS in manifest["files"] else {}
        schedules = extra["schedules"]
        return Saved(
            trainer,
            modules,
            {name: optim.get(name) for name in schedules},
            schedules,
            extra["processes"],
            extra["algorithm"],
            extra["plugins"],
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {str(folder)!r} lacks what a resume needs ({one_line(exc)}): "
            "resume from another checkpoint or start the run again"
        ) from None


def _read_legacy(folder: Path, trainer: dict[str, Any], modules: dict[str, Any]) -> Saved:
    """An earlier agentrl's checkpoint: (state, schedule) pairs in optimizers.pt, the rest in
    state.pt, whose numpy RNG array is the one kind of object allowed beyond weights_only's own."""
    pairs = load_tensors(folder / OPTIMIZERS)
    reconstruct = np.zeros(1).__reduce__()[0]  # numpy's array rebuild function (its module moved in numpy 2)
    extra = load_tensors(folder / LEGACY_EXTRA, allow=[reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))])
    processes = extra.get("processes") or [{"rng": extra["rng"], "engine": extra["engine"]}]
    return Saved(
        trainer,
        modules,
        {name: state for name, (state, _) in pairs.items()},
        {name: schedule for name, (_, schedule) in pairs.items()},
        processes,
        extra["algorithm"],
        extra["plugins"],
    )


def weights_folder(run_dir: Path, folder: Path) -> Path:
    """Where the policy weights of checkpoint ``folder`` are: inside it, or (a finished run's
    slimmed checkpoint) the export its manifest names; a ConfigError when that is gone."""
    manifest = read_manifest(folder)
    moved = (manifest or {}).get("weights_in")
    if moved:
        name = moved["folder"]
    elif (folder / WEIGHTS).is_dir():
        return folder / WEIGHTS
    else:  # an earlier agentrl named it in the trainer state
        name = read_json(folder / STATE).get("weights_in")
    if name is None or not (run_dir / name).is_dir():
        raise ConfigError(
            f"checkpoint {str(folder)!r} holds no weights and the run's {name or WEIGHTS}/ folder they "
            f"were left in is missing from {str(run_dir)!r}: start the run again"
        )
    return run_dir / name
