"""Resumable checkpoints: atomic ``step-N`` folders under ``<run_dir>/checkpoints``.

A checkpoint is written into a temporary folder beside its final place, flushed to disk, marked
complete, then renamed (a rename is atomic on one filesystem), so a process killed at any moment
leaves either the previous checkpoints or the new one, never half of one. Only the newest
``keep`` complete checkpoints stay. What goes inside is the trainer's business
(:meth:`agentrl.trainer.Trainer.save_checkpoint`); this module only knows folders.

A run that finishes normally keeps only its last checkpoint, slimmed by :func:`slim_finished`
(unless ``keep_finished_checkpoints``): without the optimizer moments (AdamW holds twice the weights),
and without the policy's weights when the exported ``model/`` (or ``last/``) holds the same files.
Resuming it with a larger ``--max-steps`` restarts the moments. Interrupted runs keep whole
checkpoints, so their resume stays exact.
"""

from __future__ import annotations

import filecmp
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.errors import ConfigError

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
WEIGHTS = "model"  # the policy's weights inside a checkpoint (a save_pretrained folder)
OPTIMIZERS = "optimizers.pt"  # {name: (optimizer state or None when slimmed, schedule state)}
STATE = "trainer_state.json"
_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return run_dir / CHECKPOINTS / f"step-{step:06d}"


def write_atomically(run_dir: Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """Run ``write(folder)`` into a temporary folder and move it to ``step-N`` when complete;
    then delete all but the newest ``keep`` complete checkpoints. A complete checkpoint of the
    same step already there is kept as is (the state of a step is the state of that step)."""
    final = checkpoint_dir(run_dir, step)
    if (final / COMPLETE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        write(tmp)
        (tmp / COMPLETE).write_text(f"{step}\n")
        _fsync_tree(tmp)
        if final.exists():  # an incomplete leftover of the same step (cannot happen with rename, but be safe)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in complete_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary and unmarked folders ignored)."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / COMPLETE).is_file()]
    return [p for _, p in sorted(found)]


def remove_partial(run_dir: Path) -> None:
    """Delete temporary folders a killed save left behind."""
    root = run_dir / CHECKPOINTS
    for path in root.glob(".tmp-step-*") if root.is_dir() else []:
        shutil.rmtree(path, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint of ``run_dir``; a ConfigError saying why there is none."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {str(run_dir)!r}: not a run dir (no config.yaml)")
    found = complete_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"--resume {str(run_dir)!r}: the run has no complete checkpoint under {CHECKPOINTS}/ "
                          "(checkpoint_every was 0, or it stopped before its first checkpoint): start it again")
    return found[-1]


def rng_states() -> dict[str, Any]:
    """Every global random generator's state (Python, numpy, torch CPU and CUDA)."""
    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` captured."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def truncate(path: Path, size: int) -> None:
    """Cut ``path`` back to ``size`` bytes (lines written after a checkpoint, or a torn last line)."""
    if path.is_file() and path.stat().st_size > size:
        with path.open("r+b") as f:
            f.truncate(size)


def file_size(path: Path) -> int:
    """``path``'s size in bytes, 0 when it does not exist."""
    return path.stat().st_size if path.is_file() else 0


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        _fsync(path)
    _fsync(root)


def resume_config(run_dir: str | Path, max_steps: int | None = None) -> tuple[Any, Path]:
    """The config a run dir was started with (``max_steps`` may be raised to train longer) and its
    newest complete checkpoint; a ConfigError when the two disagree or nothing can be resumed."""
    from agentrl.config import TrainConfig, build_config, load_yaml

    run_dir = Path(run_dir)
    folder = latest_checkpoint(run_dir)
    saved = json.loads((folder / STATE).read_text())
    data = load_yaml((run_dir / "config.yaml").read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--resume {str(run_dir)!r}: config.yaml does not hold a mapping")
    data["output_dir"] = str(run_dir)
    if max_steps is not None:
        data["max_steps"] = max_steps
    config = build_config(overrides=data)
    written = {**TrainConfig().to_dict(), **saved["config"]}  # a key newer than the checkpoint counts at its default
    stored = {k: v for k, v in written.items() if k not in ("output_dir", "max_steps")}
    now = {k: v for k, v in config.to_dict().items() if k not in ("output_dir", "max_steps")}
    changed = sorted(k for k in stored.keys() | now.keys() if stored.get(k) != now.get(k))
    if changed:
        raise ConfigError(f"--resume {str(run_dir)!r}: config.yaml differs from the checkpoint's config in "
                          f"{', '.join(changed)}; a resumed run keeps its config (only --max-steps may change)")
    if config.max_steps < saved["step"]:
        raise ConfigError(f"--resume {str(run_dir)!r}: max_steps {config.max_steps} is below the checkpoint's "
                          f"step {saved['step']}")
    return config, folder


def slim_finished(run_dir: Path, folder: Path, weights_in: str | None) -> None:
    """Shrink a finished run to what ``--resume --max-steps`` needs: delete every checkpoint but
    ``folder`` (its last), drop the optimizer moments from it (the schedules stay) and its policy
    weights when ``run_dir/weights_in`` (the export) holds the same files, naming that folder in
    its trainer state. Each change is atomic: a kill at any moment leaves a loadable checkpoint."""
    for old in complete_checkpoints(run_dir):
        if old.name != folder.name:
            shutil.rmtree(old, ignore_errors=True)
    optimizers = torch.load(folder / OPTIMIZERS, weights_only=False, mmap=True)
    slim = {name: (None, schedule) for name, (_, schedule) in optimizers.items()}
    del optimizers  # release the mapped file before it is replaced
    _replace(folder / OPTIMIZERS, lambda tmp: torch.save(slim, tmp))
    if weights_in is not None and _same_weights(folder / WEIGHTS, run_dir / weights_in):
        state = json.loads((folder / STATE).read_text())
        _replace(folder / STATE, lambda tmp: tmp.write_text(json.dumps({**state, "weights_in": weights_in}, indent=1)))
        gone = folder / f".{WEIGHTS}.deleting"
        shutil.rmtree(gone, ignore_errors=True)  # left by a kill during an earlier attempt
        os.rename(folder / WEIGHTS, gone)  # atomic: the weights are here or in run_dir/weights_in, never half
        shutil.rmtree(gone)


def _replace(path: Path, write: Callable[[Path], None]) -> None:
    """Write ``path`` anew through a temporary file beside it, renamed over it when flushed."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    _fsync(tmp)
    os.replace(tmp, path)


def weights_folder(run_dir: Path, folder: Path) -> Path:
    """Where the policy weights of checkpoint ``folder`` are: inside it, or (a finished run's
    slimmed checkpoint) the export its trainer state names; a ConfigError when that is gone."""
    if (folder / WEIGHTS).is_dir():
        return folder / WEIGHTS
    name = json.loads((folder / STATE).read_text()).get("weights_in")
    if name is None or not (run_dir / name).is_dir():
        raise ConfigError(f"checkpoint {str(folder)!r} holds no weights and the run's {name or WEIGHTS}/ folder they "
                          f"were left in is missing from {str(run_dir)!r}: start the run again")
    return run_dir / name


def _same_weights(a: Path, b: Path) -> bool:
    """Whether folders ``a`` and ``b`` hold the same ``*.safetensors`` files, byte for byte."""
    names = sorted(p.name for p in a.glob("*.safetensors"))
    return (bool(names) and names == sorted(p.name for p in b.glob("*.safetensors"))
            and all(filecmp.cmp(a / n, b / n, shallow=False) for n in names))
