"""The run directory: where a run writes, whether it may, and how ``--resume`` finds its config.

A run dir holds ``config.yaml``, ``metrics.jsonl``, ``completions.jsonl`` and
``eval_completions.jsonl`` (:mod:`agentrl.rundir.episodes`), ``checkpoints/``, ``model/``,
``eval.json`` and plots. Starting a run in a dir that already holds one is refused
(its metrics would mix); ``--resume`` continues it from its newest intact checkpoint
(:func:`resume_config`), or starts it over when it stopped before its first one
(:func:`start_over_config`, :func:`set_aside_unfinished`).
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from agentrl.config.train import TrainConfig, build_config
from agentrl.config.yaml_text import load_yaml
from agentrl.errors import ConfigError
from agentrl.rundir import checkpoints as ckpt
from agentrl.rundir.links import open_nofollow, refuse_links
from agentrl.rundir.lock import LOCK_FILE
from agentrl.rundir.metrics import read_rows
from agentrl.rundir.paths import folder_problem


def run_dir_for(config: TrainConfig) -> Path:
    """The run directory: ``output_dir``, else ``runs/<env>-<algo>-<timestamp>``."""
    label = config.env.rpartition(":")[2].replace("/", "_")  # a file env: its class name
    return Path(config.output_dir or f"runs/{label}-{config.algo}-{datetime.now():%Y%m%d-%H%M%S}")


def refuse_existing_run(run_dir: Path) -> None:
    """A ConfigError when ``run_dir`` is a file or already holds a run (its metrics would mix)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"output_dir {str(run_dir)!r} is a file, not a directory: pick another --output-dir")
    held = [name for name in ("metrics.jsonl", ckpt.CHECKPOINTS, "model") if (run_dir / name).exists()]
    if held and _finished_without_checkpoint(run_dir):
        raise ConfigError(
            f"output_dir {str(run_dir)!r} already holds a finished run ({', '.join(held)}) with no "
            f"checkpoint to continue from ({_why_no_checkpoint(run_dir)}): pick another --output-dir"
        )
    if held:  # --resume continues it, or starts it over when it stopped before its first checkpoint
        raise ConfigError(
            f"output_dir {str(run_dir)!r} already holds a run ({', '.join(held)}): continue it with "
            f"`agentrl train --resume {run_dir}`, or pick another --output-dir"
        )


def _finished_without_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "eval.json").is_file() and not ckpt.complete_checkpoints(run_dir)


def _why_no_checkpoint(run_dir: Path) -> str:
    """Why a finished run has no checkpoint: its config wrote none, or they were removed since."""
    try:
        every = (load_yaml((run_dir / "config.yaml").read_text()) or {}).get("checkpoint_every")
    except (OSError, UnicodeDecodeError, ConfigError, AttributeError):
        every = None
    if every == 0:
        return "checkpoint_every: 0"
    setting = f"checkpoint_every: {every}" if isinstance(every, int) else "its config.yaml is unreadable"
    return f"{setting}, but none is left under {ckpt.CHECKPOINTS}/: they were removed"


def start_over_config(run_dir: str | Path, max_steps: int | None = None) -> TrainConfig | None:
    """For ``--resume`` of a run that stopped before its first complete checkpoint: the config it
    was started with (``max_steps`` changed if given), to train it again from step 0 after
    :func:`set_aside_unfinished`; None when the run has a checkpoint to resume from, or is no run
    dir (:func:`resume_config` says so). A ConfigError for a run that finished
    without a checkpoint: there is nothing to continue."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() or ckpt.complete_checkpoints(run_dir):
        return None
    refuse_links(run_dir, f"--resume {str(run_dir)!r}")
    if _finished_without_checkpoint(run_dir):
        raise ConfigError(
            f"--resume {str(run_dir)!r}: the run finished without a checkpoint ({_why_no_checkpoint(run_dir)}), "
            "so there is nothing to continue: train a new run with another --output-dir"
        )
    data = load_yaml((run_dir / "config.yaml").read_text(), where=str(run_dir / "config.yaml"))
    if not isinstance(data, dict):
        raise ConfigError(f"--resume {str(run_dir)!r}: config.yaml does not hold a mapping")
    data["output_dir"] = str(run_dir)
    if max_steps is not None:
        data["max_steps"] = max_steps
    return build_config(overrides=data)


UNFINISHED = "unfinished-"
"""Prefix of the folder a run started over keeps its stopped attempt's files in."""


def set_aside_unfinished(run_dir: Path) -> Path | None:
    """Move what a run that stopped before its first checkpoint wrote (metrics, completions,
    TensorBoard, ...; all but ``config.yaml``, the lock and earlier such folders) into
    ``unfinished-<time>/`` so the run can start over in its dir; that folder, or None when there
    was nothing to move. Half-written checkpoints are deleted."""
    ckpt.remove_partial(run_dir)
    keep = {"config.yaml", LOCK_FILE}
    left = [p for p in run_dir.iterdir() if p.name not in keep and not p.name.startswith(UNFINISHED)]
    if not left:
        return None
    folder = run_dir / f"{UNFINISHED}{datetime.now():%Y%m%d-%H%M%S}"
    folder.mkdir()
    for path in left:
        path.rename(folder / path.name)
    return folder


def resume_config(
    run_dir: str | Path, max_steps: int | None = None, say: Callable[[str], None] = ckpt.say
) -> tuple[Any, Path]:
    """The config a run dir was started with (``max_steps`` may be raised to train longer) and its
    newest intact checkpoint (``say``: the notes on damaged newer ones); a ConfigError when the
    two disagree, the run dir cannot be written, or nothing can be resumed."""
    run_dir = Path(run_dir)
    if run_dir.is_dir():
        refuse_links(run_dir, f"--resume {str(run_dir)!r}")
    folder = ckpt.intact_checkpoint(run_dir, say)
    problem = folder_problem(run_dir) or _log_problem(run_dir)
    if problem is not None:
        raise ConfigError(f"--resume {str(run_dir)!r}: {problem}; a resumed run writes there (metrics, checkpoints)")
    saved = ckpt.read_json(folder / ckpt.STATE)
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
        raise ConfigError(
            f"--resume {str(run_dir)!r}: config.yaml differs from the checkpoint's config in "
            f"{', '.join(changed)}; a resumed run keeps its config (only --max-steps may change)"
        )
    if config.max_steps < saved["step"]:
        raise ConfigError(
            f"--resume {str(run_dir)!r}: max_steps {config.max_steps} is below the checkpoint's step {saved['step']}"
        )
    return config, folder


ROOM = 1 << 20
"""Bytes a resume writes (and removes) first, to find a full disk before anything is loaded."""


def _log_problem(run_dir: Path) -> str | None:
    """Why the run's logs (or its checkpoints folder) cannot be appended to, None if they can;
    a disk without :data:`ROOM` bytes free says so (free disk space)."""
    for path in [
        *(run_dir / f"{log}.jsonl" for log in ("metrics", "completions", "eval_completions")),
        run_dir / ckpt.CHECKPOINTS,
    ]:
        try:
            if path.is_file():
                open_nofollow(path, "a").close()
            elif path.is_dir():
                tempfile.TemporaryFile(dir=path).close()
        except OSError as exc:
            return f"{str(path)!r} is not writable ({exc.strerror or exc})"
    try:
        with tempfile.TemporaryFile(dir=run_dir) as probe:
            probe.write(bytes(ROOM))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        return disk_problem(run_dir, exc)
    return None


def disk_problem(run_dir: Path, exc: OSError) -> str:
    """``exc`` (a write in ``run_dir`` that failed) in words, with the fix when the disk is full."""
    cause = (exc.strerror or str(exc)).lower()
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{str(run_dir)!r} has no room ({cause}: free disk space)"
    return f"{str(run_dir)!r} is not writable ({exc.strerror or exc})"


def truncate(path: Path, size: int) -> str | None:
    """Cut ``path`` back to ``size`` bytes (lines written after a checkpoint, or a torn last line).
    A file found shorter was cut by something else: its complete lines stay, a torn last line
    goes, and the returned note says so (None when nothing was lost)."""
    have = file_size(path)
    if have >= size:
        if have > size:
            with open_nofollow(path, "r+b") as f:
                f.truncate(size)
        return None
    data = path.read_bytes() if path.is_file() else b""
    whole = data.rfind(b"\n") + 1
    torn = ""
    if whole < len(data):
        with open_nofollow(path, "r+b") as f:
            f.truncate(whole)
        torn = f"; its torn last line ({len(data) - whole} bytes) was dropped"
    return (
        f"{path} is {have} bytes, shorter than the {size} the checkpoint recorded: lines written before the "
        f"checkpoint were lost{torn}; the run appends to what is left"
    )


def file_size(path: Path) -> int:
    """``path``'s size in bytes, 0 when it does not exist."""
    return path.stat().st_size if path.is_file() else 0


def read_history(path: Path) -> list[dict[str, float]]:
    """The per-step metrics rows already in ``metrics.jsonl`` (a resumed run's earlier steps)."""
    return [
        {k: v for k, v in row.items() if k != "step"}
        for row in read_rows(path)
        if not any(k.startswith("final/") for k in row)
    ]
