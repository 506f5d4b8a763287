"""trackio: a run of the project ``project`` in trackio's local store (``$TRACKIO_DIR``, by default
``~/.cache/huggingface/trackio``; ``trackio show`` opens it), or a Space with ``$TRACKIO_SPACE_ID``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl_trackers.base import COLUMNS, Tracker, run_name


class TrackioTracker(Tracker):
    """A trackio run: the step's scalars and a ``completions`` table at ``step``, the config as the
    run config, the final metrics at the last step. A resumed run dir continues the run of its name."""

    def __init__(self, settings: Any, run_dir: Path, config: dict[str, Any], resume_id: str | None) -> None:
        import trackio

        self.trackio = trackio
        self.run = trackio.init(
            project=settings.project,
            name=resume_id or run_name(settings, run_dir),
            config=config,
            resume="allow" if resume_id else "never",
            embed=False,
        )
        self.run_id = self.run.name

    def log_step(self, step: int, scalars: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """The scalars (and the table) at ``step``."""
        data: dict[str, Any] = dict(scalars)
        if rows:
            data["completions"] = self.trackio.Table(
                columns=list(COLUMNS), data=[[row[c] for c in COLUMNS] for row in rows]
            )
        self.run.log(data, step=step)

    def finish(self, step: int, final: dict[str, float]) -> None:
        """The final metrics at ``step``, then the run finished (its logs flushed)."""
        if final:
            self.run.log(final, step=step)
        self.run.finish()
