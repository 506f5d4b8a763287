"""Tasks from a dataset: a JSONL, JSON, CSV or Parquet file, a folder a ``datasets.Dataset`` (or
``DatasetDict``) was saved to, or rows already in memory (a list of dicts, a ``datasets.Dataset``);
each row one task dict, every column kept (reward functions read them). :func:`dataset_splits`
gives the training and held-out splits: the held-out rows given, or a seeded fraction of the
distinct tasks, never overlapping training (a task's identity: :func:`agentrl.env.tasks.task_key`).
Nothing is fetched from a hub."""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.env.tasks import Task, task_key
from agentrl.errors import ConfigError, one_line
from agentrl.imports import import_extra

FORMATS = ".jsonl, .json, .csv, .parquet or a folder a datasets.Dataset was saved to (save_to_disk)"
"""What a dataset path may be, in words."""
EVAL_SPLITS = ("test", "validation", "eval")
"""A saved ``DatasetDict``'s split names taken as the held-out rows, in this order."""
_DATASETS_HINT = "reading a saved datasets.Dataset needs the datasets library: pip install 'agentrl[datasets]'"


def read_rows(source: Any, what: str = "dataset") -> tuple[list[Task], list[Task] | None]:
    """(rows, held-out rows or None) of ``source``: a path (``str`` / ``Path``), a list of dicts, a
    ``datasets.Dataset`` or a ``DatasetDict`` (its ``train`` split, and its ``test`` / ``validation``
    split as held-out rows). ConfigError naming ``what``, the source and the first bad row otherwise."""
    if isinstance(source, (str, Path)):
        return _read_path(Path(source).expanduser(), what)
    if isinstance(source, Mapping) and source and all(hasattr(split, "to_list") for split in source.values()):
        return _split_dict(source, what)  # a DatasetDict
    if hasattr(source, "to_list"):  # a datasets.Dataset (or a pandas-like table)
        return _checked(source.to_list(), what), None
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return _checked(list(source), what), None
    raise ConfigError(
        f"{what}: {type(source).__name__} is not a dataset; give a path ({FORMATS}), "
        "a list of dicts or a datasets.Dataset"
    )


def dataset_splits(
    rows: list[Task], held_out: list[Task] | None, fraction: float, seed: int, what: str = "dataset"
) -> tuple[list[Task], list[Task]]:
    """(train, held-out): with ``held_out`` given, ``rows`` and it, refused when a task is in both;
    else a seeded ``fraction`` of ``rows``' distinct tasks held out (at least one when ``fraction`` >
    0; identical tasks always fall on one side), the training rows in their order."""
    if held_out is not None:
        train_keys = {task_key(row) for row in rows}
        both = [row for row in held_out if task_key(row) in train_keys]
        if both:
            raise ConfigError(
                f"{what}: {len(both)} held-out task(s) are also training tasks (e.g. {_short(both[0])}); "
                "a held-out split must not overlap training: remove them from one side"
            )
        return rows, held_out
    if fraction <= 0:
        return rows, []
    keys = sorted({task_key(row) for row in rows})
    if len(keys) < 2:
        raise ConfigError(
            f"{what}: needs at least 2 distinct tasks to hold out a fraction ({len(keys)} found); "
            "give held-out tasks (eval_path) or dataset.eval_fraction: 0"
        )
    count = min(len(keys) - 1, max(1, math.floor(len(keys) * fraction)))
    order = np.random.default_rng(seed).permutation(len(keys))
    chosen = {keys[i] for i in order[:count]}
    return [r for r in rows if task_key(r) not in chosen], [r for r in rows if task_key(r) in chosen]


def _read_path(path: Path, what: str) -> tuple[list[Task], list[Task] | None]:
    """Rows of the file or saved dataset folder at ``path``."""
    if path.is_dir():
        datasets = import_extra("datasets", _DATASETS_HINT, ConfigError)
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise ConfigError(f"{what} {str(path)!r}: not a saved datasets.Dataset ({one_line(exc)})") from None
        return read_rows(loaded, what)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist; give {FORMATS}")
    suffix = path.suffix.lower()
    readers = {".jsonl": _jsonl, ".json": _json, ".csv": _csv, ".parquet": _parquet}
    if suffix not in readers:
        raise ConfigError(f"{what} {str(path)!r}: unknown format {suffix or '(no suffix)'!r}; give {FORMATS}")
    try:
        rows = readers[suffix](path, what)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {str(path)!r} could not be read: {one_line(exc)}") from None
    return _checked(rows, f"{what} {str(path)!r}"), None


def _jsonl(path: Path, what: str) -> list[Any]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{what} {str(path)!r}, line {number}: not valid JSON ({exc.msg})") from None
    return rows


def _json(path: Path, what: str) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, list):
        raise ConfigError(f"{what} {str(path)!r}: expected a JSON list of objects, got {type(data).__name__}")
    return data


def _csv(path: Path, what: str) -> list[Any]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [dict(row) for row in csv.DictReader(handle)]


def _parquet(path: Path, what: str) -> list[Any]:
    parquet = import_extra(
        "pyarrow.parquet", "reading Parquet needs pyarrow: pip install 'agentrl[datasets]'", ConfigError
    )
    try:
        return parquet.read_table(str(path)).to_pylist()
    except Exception as exc:
        raise ConfigError(f"{what} {str(path)!r}: not a readable Parquet file ({one_line(exc)})") from None


def _split_dict(splits: Any, what: str) -> tuple[list[Task], list[Task] | None]:
    """A ``DatasetDict``: its ``train`` split (its only one, when it has one), and its first of
    :data:`EVAL_SPLITS` as held-out rows."""
    names = list(splits.keys())
    train = "train" if "train" in names else names[0] if len(names) == 1 else None
    if train is None:
        raise ConfigError(f"{what}: a DatasetDict with splits {names} has no 'train' split")
    held = next((name for name in EVAL_SPLITS if name in names), None)
    rows = _checked(splits[train].to_list(), f"{what} (split {train!r})")
    return rows, (_checked(splits[held].to_list(), f"{what} (split {held!r})") if held else None)


def _checked(rows: list[Any], what: str) -> list[Task]:
    """``rows`` as task dicts: each a mapping with string keys; at least one."""
    if not rows:
        raise ConfigError(f"{what} holds no rows: it needs at least one task")
    for number, row in enumerate(rows, 1):
        if not isinstance(row, Mapping) or not all(isinstance(key, str) for key in row):
            raise ConfigError(f"{what}, row {number}: expected an object of named columns, got {_short(row)}")
    return [dict(row) for row in rows]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.lru_cache(maxsize=4)
def _cached_splits(path: str, eval_path: str | None, fraction: float, seed: int, stamp: tuple[Any, ...]) -> Any:
    rows, held_out = read_rows(path, "dataset.path")
    if eval_path is not None:
        held_out = read_rows(eval_path, "dataset.eval_path")[0]
    return dataset_splits(rows, held_out, fraction, seed, f"dataset {path!r}")


def use_dataset(env: Any, section: Mapping[str, Any] | None) -> Any:
    """``env`` with the run's ``dataset`` section (None: unchanged) as its task source
    (:meth:`agentrl.Env.use_tasks`); the files are read once per process while they are unchanged."""
    if section is None:
        return env
    path, eval_path = section["path"], section.get("eval_path")
    stamp = tuple(_stamp(p) for p in (path, eval_path) if p is not None)
    train, held_out = _cached_splits(
        path, eval_path, float(section.get("eval_fraction", 0.1)), int(section.get("split_seed", 0)), stamp
    )
    env.use_tasks(train, held_out)
    return env


def _stamp(path: str) -> tuple[Any, ...]:
    """What tells a changed file (or saved dataset folder) from the one read before."""
    try:
        info = Path(path).stat()
    except OSError:
        return (path,)
    return (path, info.st_mtime_ns, info.st_size)
