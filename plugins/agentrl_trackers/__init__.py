"""Experiment trackers (Weights & Biases, MLflow, trackio) as a logging plugin on the public hooks.

Turn them on with ``--set 'plugins.trackers.report_to=[wandb, mlflow]'`` (the ``trackers`` extra:
``pip install 'agentrl[trackers]'``). Each tracker named gets, per step, the step's scalars (every
number of the step's metrics, as ``metrics.jsonl`` holds them), a completions table on the steps that
``completions.jsonl`` logs (``log_completions_every``: step, group, prompt, completion, reward, answer),
the run config once, and the final evaluation at the end. TensorBoard stays as it is (core writes it).

What it uses is what any plugin can: the ``plugins.trackers`` settings section
(``agentrl_register_settings``), ``agentrl_on_train_start`` (start each tracker, or continue the
tracker run a resumed run dir names in ``trackers.json``), ``agentrl_on_step_end`` (log) and
``agentrl_on_train_end`` (the final metrics, finish). The completions come from the run dir's
``completions.jsonl``, which core writes before ``agentrl_on_step_end``.

Failures: a tracker library that is not installed is refused when the config is built, before any
model loads (one line naming the package); a tracker that cannot start stops the run with one line;
a tracker that raises later is warned about once (one line on stderr), is off for the rest of the
run, and ``trackers/failed`` (the number of trackers turned off so far) is logged from then on.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl import ConfigCheck, ConfigError, PluginError, build_plugin_config, hookimpl, one_line
from agentrl_trackers.base import Tracker, completion_rows

SECTION = "trackers"
TRACKERS: dict[str, tuple[str, str, str]] = {
    "wandb": ("wandb", "wandb", "agentrl_trackers.wandb_tracker:WandbTracker"),
    "mlflow": ("mlflow", "mlflow-skinny", "agentrl_trackers.mlflow_tracker:MlflowTracker"),
    "trackio": ("trackio", "trackio", "agentrl_trackers.trackio_tracker:TrackioTracker"),
}
"""Each tracker: the module it imports, the package that installs it, and its class."""
IDS_FILE = "trackers.json"
"""The run dir's record of each tracker's run id, so a resumed run continues the same tracker run."""


@dataclass(frozen=True)
class TrackersConfig:
    """The ``plugins.trackers`` section."""

    report_to: list[str] = field(default_factory=list)
    """Trackers to log to: any of wandb, mlflow, trackio ([]: none; TensorBoard is always written)."""
    project: str = "agentrl"
    """The tracker project (W&B project, MLflow experiment, trackio project)."""
    run_name: str | None = None
    """The tracker run's name (None: the run dir's name)."""
    completions_table: bool = True
    """Log a table of the episodes on the steps ``completions.jsonl`` logs (``log_completions_every``)."""
    wandb_entity: str | None = None
    """The W&B entity (team or user; None: your default). ``WANDB_MODE=offline`` logs offline."""
    mlflow_tracking_uri: str | None = None
    """Where MLflow logs (None: ``$MLFLOW_TRACKING_URI`` if set, else ``file:<run_dir>/mlruns``)."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming an unknown or uninstalled tracker."""
        check = ConfigCheck(self, f"plugins.{SECTION}")
        check.declared()
        for i, name in enumerate(self.report_to):
            if name not in TRACKERS:
                check.fail("report_to", f"{name!r} is not a tracker; expected a list of {', '.join(TRACKERS)}")
            if name in self.report_to[:i]:
                check.fail("report_to", f"{name!r} is named twice; name each tracker once")
        for name in self.report_to:
            module, package, _ = TRACKERS[name]
            if not _installed(module):
                raise ConfigError(
                    f"plugins.{SECTION}.report_to names {name}, but {module} is not installed: "
                    f"pip install 'agentrl[trackers]' (or pip install {package})"
                )


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is not a package, or a module without a spec
        return False


def tracker_class(name: str) -> type[Tracker]:
    """The class of tracker ``name``, imported now."""
    module, _, path = TRACKERS[name][2].partition(":")
    return getattr(importlib.import_module(module), path)


class Session:
    """The trackers of one run: logs to each, and turns off one that raises (warned once)."""

    def __init__(self, settings: TrackersConfig, run_dir: Path, config: dict[str, Any]) -> None:
        self.settings, self.run_dir = settings, run_dir
        self.trackers: dict[str, Tracker] = {}
        self.failed: list[str] = []
        self.step = 0
        ids_path = run_dir / IDS_FILE
        ids = json.loads(ids_path.read_text()) if ids_path.is_file() else {}
        completions = run_dir / "completions.jsonl"
        self.offset = completions.stat().st_size if completions.is_file() else 0  # a resumed run's are logged
        for name in settings.report_to:
            try:
                self.trackers[name] = tracker_class(name)(settings, run_dir, config, ids.get(name))
            except Exception as exc:
                self.close({}, 0)
                raise PluginError(f"tracker {name} could not start: {one_line(exc)}") from exc
        ids.update({name: tracker.run_id for name, tracker in self.trackers.items() if tracker.run_id})
        _replace(ids_path, json.dumps(ids, indent=2) + "\n")

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """Log the step's scalars and (when it logged completions) its table to every tracker."""
        self.step = step
        rows = self._rows(step) if self.settings.completions_table else []
        scalars = {key: float(value) for key, value in metrics.items() if _is_number(value)}
        self._each(step, lambda tracker: tracker.log_step(step, scalars, rows))
        if self.failed:
            metrics["trackers/failed"] = float(len(self.failed))

    def close(self, final: dict[str, float], step: int) -> None:
        """Log the final metrics and finish every tracker still on."""
        scalars = {key: float(value) for key, value in final.items() if _is_number(value)}
        self._each(step, lambda tracker: tracker.finish(step, scalars))
        self.trackers.clear()

    def _each(self, step: int, call: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self.trackers.items()):
            try:
                call(tracker)
            except Exception as exc:
                del self.trackers[name]
                self.failed.append(name)
                _warn(f"tracker {name} failed at step {step} and is off for the rest of the run: {one_line(exc)}")

    def _rows(self, step: int) -> list[dict[str, Any]]:
        """The step's table rows; a ``completions.jsonl`` that cannot be read turns the tables off (warned)."""
        try:
            return self._new_rows(step)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.settings = dataclasses.replace(self.settings, completions_table=False)
            _warn(f"the completions table is off for the rest of the run: {one_line(exc)}")
            return []

    def _new_rows(self, step: int) -> list[dict[str, Any]]:
        """The episodes ``completions.jsonl`` gained for ``step`` since the last call."""
        path = self.run_dir / "completions.jsonl"
        if not path.is_file():
            return []
        with path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.offset += len(whole)
        records = [json.loads(line) for line in whole.splitlines() if line.strip()]
        return completion_rows([r for r in records if r.get("step") == step])


def _replace(path: Path, text: str) -> None:
    """Write ``path`` through a new file renamed over it: a link at ``path`` is replaced, never followed."""
    tmp = path.with_name(f".{path.name}-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # bools too, as 0 / 1


_session: Session | None = None
"""The trackers of the run in progress (hooks run on the main process, one run at a time)."""


@hookimpl
def agentrl_register_settings(register: Callable[..., None]) -> None:
    """Register the ``plugins.trackers`` section."""
    register(SECTION, TrackersConfig)


@hookimpl
def agentrl_on_train_start(config: Any, run_dir: str) -> None:
    """Start (or, in a resumed run dir, continue) each tracker ``report_to`` names."""
    global _session
    if _session is not None:  # a run that ended without agentrl_on_train_end (it raised)
        _session.close({}, 0)
        _session = None
    settings = build_plugin_config(TrackersConfig, config.plugins.get(SECTION, {}), f"plugins.{SECTION}")
    if settings.report_to:
        _session = Session(settings, Path(run_dir), config.to_dict())


@hookimpl
def agentrl_on_step_end(step: int, metrics: dict[str, float]) -> None:
    """Log the step to every tracker on."""
    if _session is not None:
        _session.log_step(step, metrics)


@hookimpl
def agentrl_on_train_end(run_dir: str, metrics: dict[str, float]) -> None:
    """Log the final evaluation (``final/<key>``) and finish the trackers."""
    global _session
    if _session is not None:
        _session.close({f"final/{key}": value for key, value in metrics.items()}, _session.step)
        _session = None


__all__ = ["TRACKERS", "Session", "Tracker", "TrackersConfig", "tracker_class"]
