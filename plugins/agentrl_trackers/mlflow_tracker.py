"""MLflow (``mlflow-skinny`` is enough): a run in the experiment ``project``, by default in the local
file store ``file:<run_dir>/mlruns`` (``mlflow ui --backend-store-uri <run_dir>/mlruns`` shows it).
MLflow 3 keeps that store in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``, which a ``file:``
URI sets to true unless it is set already; a database or server URI needs nothing."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from agentrl_trackers.base import COLUMNS, Tracker, flat, run_name

_BAD_KEY_CHARS = re.compile(r"[^\w\-./ ]")
"""What MLflow refuses in a metric or param name (replaced by ``_``)."""


class MlflowTracker(Tracker):
    """An MLflow run: the step's scalars as metrics at ``step``, the config as params (flattened
    ``a.b`` keys) and ``config.json``, a ``completions/step_NNNNNN.json`` table artifact per logged
    step (MLflow's table format: ``columns`` and ``data``). A resumed run dir continues its run id."""

    def __init__(self, settings: Any, run_dir: Path, config: dict[str, Any], resume_id: str | None) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = settings.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or _file_uri(run_dir / "mlruns")
        if uri.startswith("file:"):  # MLflow 3 keeps its file store in maintenance mode, behind this switch
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        if resume_id is not None:
            self.client.update_run(resume_id, status="RUNNING")
            self.run_id = resume_id
            return
        experiment = self.client.get_experiment_by_name(settings.project)
        experiment_id = (
            experiment.experiment_id if experiment is not None else self.client.create_experiment(settings.project)
        )
        run = self.client.create_run(experiment_id, run_name=run_name(settings, run_dir))
        self.run_id = run.info.run_id
        params = [Param(_key(key), value[:6000]) for key, value in flat(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.client.log_dict(self.run_id, config, "config.json")

    def log_step(self, step: int, scalars: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """The scalars as metrics at ``step``; the table as an artifact."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_key(key), value, now, step) for key, value in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])
        if rows:
            table = {"columns": list(COLUMNS), "data": [[row[c] for c in COLUMNS] for row in rows]}
            self.client.log_dict(self.run_id, table, f"completions/step_{step:06d}.json")

    def finish(self, step: int, final: dict[str, float]) -> None:
        """The final metrics at ``step``, then the run marked finished."""
        if final:
            self.log_step(step, final, [])
        self.client.set_terminated(self.run_id, "FINISHED")


def _key(key: str) -> str:
    return _BAD_KEY_CHARS.sub("_", key)


def _file_uri(path: Path) -> str:
    return path.resolve().as_uri()
