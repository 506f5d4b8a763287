"""Weights & Biases: ``wandb.init`` in ``<run_dir>/wandb`` (``WANDB_MODE=offline`` logs offline).

wandb makes symbolic links there (``latest-run``, ``debug.log`` to its newest run, a run's
``logs/debug-core.log`` to its cache): they are removed once made and at the end, since ``--resume``
refuses a run dir holding a link."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrl_trackers.base import COLUMNS, Tracker, run_name


class WandbTracker(Tracker):
    """A W&B run: the step's scalars and a ``completions`` table at ``step``, the config as the run
    config, the final metrics in the run summary. A resumed run dir continues the same W&B run id."""

    def __init__(self, settings: Any, run_dir: Path, config: dict[str, Any], resume_id: str | None) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=settings.project,
            entity=settings.wandb_entity,
            name=run_name(settings, run_dir),
            dir=str(run_dir),
            config=config,
            id=resume_id,
            resume="allow" if resume_id else None,
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )
        self.run_id = self.run.id
        self.folder = run_dir / "wandb"
        _drop_links(self.folder)

    def log_step(self, step: int, scalars: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """``run.log`` of the scalars (and the table) at ``step``."""
        data: dict[str, Any] = dict(scalars)
        if rows:
            data["completions"] = self.wandb.Table(
                columns=list(COLUMNS), data=[[row[c] for c in COLUMNS] for row in rows]
            )
        self.run.log(data, step=step)

    def finish(self, step: int, final: dict[str, float]) -> None:
        """The final metrics into the summary, then ``run.finish()``."""
        self.run.summary.update(final)
        self.run.finish()
        _drop_links(self.folder)


def _drop_links(folder: Path) -> None:
    """Remove the symbolic links inside ``folder`` at any depth (wandb's shortcuts), never following one."""
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            if (Path(top) / name).is_symlink():
                (Path(top) / name).unlink()
