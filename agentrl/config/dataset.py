"""The ``dataset`` section of the run config: :class:`DatasetConfig`, tasks from a file or a saved
``datasets.Dataset`` instead of the env's own (:mod:`agentrl.env.datasets` reads them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from agentrl.config.checks import ConfigCheck, build_plugin_config
from agentrl.config.rules import Allowed


@dataclass(frozen=True)
class DatasetConfig:
    """Where a run's tasks come from (the ``dataset`` section; ``agentrl train --dataset PATH``)."""

    path: Annotated[str, Allowed("a path: .jsonl, .json, .csv, .parquet or a saved datasets.Dataset folder")]
    """The training tasks: a JSONL, JSON (a list of objects), CSV or Parquet file, or a folder a
    ``datasets.Dataset`` / ``DatasetDict`` was saved to (``save_to_disk``; a ``DatasetDict``'s
    ``test`` or ``validation`` split is the held-out one). One task per row, every column kept:
    reward functions receive them (TRL-style: as keyword arguments)."""
    eval_path: str | None = None
    """Held-out tasks in one of the same forms (refused when one is also a training task); null:
    ``eval_fraction`` of the training tasks, held out."""
    eval_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """Without ``eval_path``: the share of the distinct tasks held out for evaluation (at least one,
    chosen by ``split_seed``; identical tasks stay on one side). 0: none held out (set
    ``eval_tasks: 0`` too)."""
    split_seed: Annotated[int, Field(ge=0)] = 0
    """Seeds which tasks ``eval_fraction`` holds out (the same seed, the same split)."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        check = ConfigCheck(self, "dataset")
        check.declared()
        if not str(self.path).strip():
            check.fail("path", "expected the path of a dataset file or folder")


def dataset_options(values: dict[str, Any] | None) -> DatasetConfig | None:
    """The validated ``dataset`` section; None (the env's own tasks) when it is null."""
    return None if values is None else build_plugin_config(DatasetConfig, values, "dataset")


def absolute_dataset(values: dict[str, Any]) -> dict[str, Any]:
    """The ``dataset`` section checked, its paths made absolute (the run's ``config.yaml`` then works
    from any directory)."""
    options = dataset_options(values)
    assert options is not None
    paths = {key: getattr(options, key) for key in ("path", "eval_path") if getattr(options, key) is not None}
    return {**values, **{key: os.path.abspath(os.path.expanduser(path)) for key, path in paths.items()}}
