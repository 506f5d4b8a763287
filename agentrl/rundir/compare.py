"""Side-by-side reading of run dirs (what ``agentrl compare`` prints and plots): their metrics
step by step, held-out accuracy before and after, and where two runs first differ.

The identity check leaves out what differs between any two runs of the same config: ``perf/*``
and any other timing or memory figure (:func:`is_timing`). Everything else (every metric at every
step, and ``completions.jsonl`` episode by episode) must match for two runs to be identical, which
is what a bit-for-bit resume gives (docs/guides/long-runs.md#checking-a-resume-with-agentrl-compare).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, TrainingError
from agentrl.rundir.links import replace_file
from agentrl.rundir.metrics import read_rows

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KEY_METRICS = (
    "reward/total_mean",
    "eval/accuracy",
    "loss/total",
    "kl",
    "policy/entropy",
    "train/grad_norm",
    "train/learning_rate",
    "rollout/sampled_tokens_mean",
)
"""The metrics ``agentrl compare`` shows without ``--metric`` or ``--all`` (those the runs logged)."""

TIMING_ENDINGS = ("seconds", "per_second")
TIMING_WORDS = ("rss", "memory")


def is_timing(key: str) -> bool:
    """Whether ``key`` is a timing or memory figure, which differs between any two runs: ``perf/*``,
    ``*seconds``, ``*per_second`` and keys naming rss or memory (``final/perf/...`` too)."""
    name = key.removeprefix("final/")
    return name.startswith("perf/") or name.endswith(TIMING_ENDINGS) or any(w in name.lower() for w in TIMING_WORDS)


@dataclass(frozen=True)
class RunRecord:
    """What a run dir holds for comparing: its metrics by step, eval.json and completions."""

    path: Path
    steps: dict[int, dict[str, Any]]
    """Step -> its metrics (the rows of a step merged: the final ``final/*`` row shares the last step)."""
    evals: dict[str, dict[str, Any]]
    """``eval.json``'s ``before`` and ``after`` metrics ({} each when absent)."""
    completions: Path | None
    """Its ``completions.jsonl`` (read episode by episode when compared); None when the run wrote none."""

    @property
    def name(self) -> str:
        """The run dir's folder name."""
        return self.path.name or str(self.path)

    def series(self, metric: str) -> list[tuple[int, float | None]]:
        """(step, value) of each step that logged ``metric`` (None: logged without a number)."""
        return [(step, _number(row[metric])) for step, row in sorted(self.steps.items()) if metric in row]


def load_run(path: str | Path) -> RunRecord:
    """Read the run dir at ``path``; a ConfigError naming it when it is not one (no ``metrics.jsonl``),
    a TrainingError naming the line of a broken JSONL file."""
    run_dir = Path(path)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        why = (
            "does not exist"
            if not run_dir.exists()
            else "is not a folder"
            if not run_dir.is_dir()
            else "has no metrics.jsonl"
        )
        raise ConfigError(f"{str(path)!r} is not a run dir: it {why} (expected a folder `agentrl train` wrote)")
    steps: dict[int, dict[str, Any]] = {}
    for row in read_rows(metrics):
        step = row.get("step")
        if isinstance(step, (int, float)) and not isinstance(step, bool):
            steps.setdefault(int(step), {}).update({k: v for k, v in row.items() if k != "step"})
    completions = run_dir / "completions.jsonl"
    return RunRecord(run_dir, steps, _read_evals(run_dir / "eval.json"), completions if completions.is_file() else None)


def _read_evals(path: Path) -> dict[str, dict[str, Any]]:
    """``eval.json``'s ``before`` and ``after`` dicts ({} each when the file or the entry is missing)."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}); fix or delete it") from None
    data = data if isinstance(data, dict) else {}
    return {when: data[when] if isinstance(data.get(when), dict) else {} for when in ("before", "after")}


def _number(value: Any) -> float | None:
    """``value`` as a float; None when it is not a number (NaN is written as null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def metric_names(runs: list[RunRecord]) -> list[str]:
    """Every metric any of ``runs`` logged, sorted."""
    return sorted({key for run in runs for row in run.steps.values() for key in row})


def choose_metrics(runs: list[RunRecord], wanted: list[str], every: bool) -> list[str]:
    """The metrics to show: all (``every``), those named in ``wanted`` (``fnmatch`` patterns such as
    ``reward/*`` allowed) or the :data:`KEY_METRICS` the runs logged. A name no run logged is a
    ConfigError listing close ones."""
    names = metric_names(runs)
    if every:
        return names
    if not wanted:
        return [m for m in KEY_METRICS if m in names] or [n for n in names if not is_timing(n)][:8]
    chosen: list[str] = []
    for name in wanted:
        found = fnmatch.filter(names, name) if any(c in name for c in "*?[") else [name] if name in names else []
        if not found:
            close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
            hint = f"close: {', '.join(close)}" if close else "--all shows every one"
            raise ConfigError(f"--metric {name!r}: none of the runs logged it ({hint})")
        chosen += [f for f in found if f not in chosen]
    return chosen


def shown_steps(runs: list[RunRecord], metric: str, points: int = 5) -> list[int]:
    """Up to ``points`` steps at which a run logged ``metric``, evenly spread, the first and last included."""
    steps = sorted({step for run in runs for step, row in run.steps.items() if metric in row})
    if len(steps) <= points:
        return steps
    return sorted({steps[round(i * (len(steps) - 1) / (points - 1))] for i in range(points)})


@dataclass(frozen=True)
class Difference:
    """Where two runs first differ: a metric at a step, or a step only one of them logged."""

    step: int
    metric: str | None
    """None: only one run logged the step (``values`` then holds that run's name)."""
    values: tuple[Any, Any]
    more: int = 0
    """How many other metrics differ at that step."""

    def describe(self) -> str:
        """One line: the step, the metric and both values."""
        if self.metric is None:
            return f"first difference at step {self.step}: only {self.values[0]} logged it"
        a, b = (_shown(v) for v in self.values)
        more = f" (and {self.more} more metric{'s' * (self.more != 1)} at that step)" if self.more else ""
        return f"first difference at step {self.step}: {self.metric} {a} vs {b}{more}"


@dataclass(frozen=True)
class Identity:
    """The identity check of two runs: their first difference (None: none) and what was compared."""

    difference: Difference | None
    steps: int
    metrics: int
    episodes: int | None
    """Episodes of ``completions.jsonl`` compared; None when a run has none."""
    episode_difference: str | None = None
    """The first differing episode of ``completions.jsonl`` and what differs in it."""

    @property
    def identical(self) -> bool:
        """No metric and no episode differs."""
        return self.difference is None and self.episode_difference is None

    def describe(self) -> str:
        """One line saying whether the runs are identical, and if not where they first differ."""
        if self.identical:
            episodes = f", {self.episodes} episodes in completions.jsonl" if self.episodes is not None else ""
            return f"identical except perf/* ({self.steps} steps, {self.metrics} metrics{episodes})"
        said = [self.difference.describe()] if self.difference else []
        if self.episode_difference:
            said.append(f"completions.jsonl differs at {self.episode_difference}")
        return "; ".join(said)


def compare_pair(a: RunRecord, b: RunRecord, tolerance: float = 0.0) -> Identity:
    """The identity check of ``b`` against ``a``: every step and every metric but timing ones
    (:func:`is_timing`), numbers equal within ``tolerance`` (absolute; 0: exactly), then
    ``completions.jsonl`` episode by episode when both runs have one."""
    keys: set[str] = set()
    difference = None
    for step in sorted(a.steps.keys() | b.steps.keys()):
        row_a, row_b = a.steps.get(step), b.steps.get(step)
        if row_a is None or row_b is None:
            difference = difference or Difference(step, None, (a.name if row_b is None else b.name, None))
            continue
        step_keys = sorted(k for k in row_a.keys() | row_b.keys() if not is_timing(k))
        keys.update(step_keys)
        differing = [k for k in step_keys if not _same(row_a.get(k, _MISSING), row_b.get(k, _MISSING), tolerance)]
        if differing and difference is None:
            first = differing[0]
            values = (row_a.get(first, _MISSING), row_b.get(first, _MISSING))
            difference = Difference(step, first, values, len(differing) - 1)
    episodes, episode_difference = _first_episode_difference(a, b, tolerance)
    return Identity(difference, len(a.steps.keys() | b.steps.keys()), len(keys), episodes, episode_difference)


class _Missing:
    def __repr__(self) -> str:
        return "(not logged)"


_MISSING = _Missing()


def _same(x: Any, y: Any, tolerance: float) -> bool:
    """Whether two logged values match: numbers within ``tolerance``, anything else equal."""
    nx, ny = _number(x), _number(y)
    if nx is not None and ny is not None:
        return nx == ny or abs(nx - ny) <= tolerance or (math.isnan(nx) and math.isnan(ny))
    return x == y


def _shown(value: Any) -> str:
    """A logged value for a message: numbers in full (a bit-level difference must show)."""
    if value is None:
        return "null"
    return repr(value) if isinstance(value, (float, _Missing)) else str(value)


def _episodes(path: Path) -> Iterator[dict[str, Any]]:
    """The episodes of a ``completions.jsonl``, one line at a time (the file may be large); a
    TrainingError naming the line of one that is not a JSON object."""
    with path.open(errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                raise TrainingError(
                    f"{path}, line {number}: not a JSON object ({line[:60]!r}); fix or delete that line"
                )
            yield row


def _first_episode_difference(a: RunRecord, b: RunRecord, tolerance: float) -> tuple[int | None, str | None]:
    """(episodes compared, the first that differs: its number, step and group, and what differs)
    over both runs' ``completions.jsonl``; (None, None) when a run has none."""
    if a.completions is None or b.completions is None:
        return None, None
    ours, theirs = _episodes(a.completions), _episodes(b.completions)
    count = 0
    for count, (x, y) in enumerate(zip_longest(ours, theirs), 1):
        if x is None or y is None:
            more, fewer = (a.name, b.name) if y is None else (b.name, a.name)
            return count, f"episode {count}: {more} has more episodes than {fewer}"
        difference = _episode_difference(x, y, count, b.name, tolerance)
        if difference:
            return count, difference
    return count, None


def _episode_difference(x: dict[str, Any], y: dict[str, Any], number: int, other: str, tolerance: float) -> str | None:
    """What differs between two episodes (the ``number``-th of their files; ``y`` is the run
    ``other``'s), None when nothing does."""
    where = f"episode {number} (step {x.get('step')}, group {x.get('group')})"
    if (x.get("step"), x.get("group")) != (y.get("step"), y.get("group")):
        return f"{where}: step {y.get('step')}, group {y.get('group')} in {other}"
    if not _same(x.get("reward"), y.get("reward"), tolerance):
        return f"{where}: reward {_shown(x.get('reward'))} vs {_shown(y.get('reward'))}"
    messages_x, messages_y = x.get("messages") or [], y.get("messages") or []
    for index, (mx, my) in enumerate(zip(messages_x, messages_y)):
        if mx != my:
            role = mx.get("role", "?") if isinstance(mx, dict) else "?"
            return f"{where}: message {index} ({role}) {_excerpt(mx)} vs {_excerpt(my)}"
    if len(messages_x) != len(messages_y):
        return f"{where}: {len(messages_x)} vs {len(messages_y)} messages"
    if x.get("answer") != y.get("answer"):
        return f"{where}: answer {x.get('answer')!r} vs {y.get('answer')!r}"
    return None


def compare_figure(runs: list[RunRecord], metrics: list[str]) -> Figure:
    """One panel per metric, each run a line in its colour (3 panels a row, 5 by 4 inches each)."""
    from matplotlib.figure import Figure  # no pyplot: no global figure registry, no backend switch

    columns = min(3, len(metrics))
    rows = math.ceil(len(metrics) / columns)
    fig = Figure(figsize=(5 * columns, 4 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[len(metrics) :]:
        fig.delaxes(ax)
    for ax, metric in zip(axes.flat, metrics):
        for color, run in enumerate(runs):
            points = [(s, v) for s, v in run.series(metric) if v is not None]
            if points:
                marker = "." if len(points) < 60 else None
                ax.plot(*zip(*points), marker=marker, label=run.name, color=f"C{color}", alpha=0.8)
        ax.set_title(metric)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(" vs ".join(run.name for run in runs))
    fig.tight_layout()
    return fig


def _excerpt(message: Any) -> str:
    """A message's content for a one-line report, cut at 40 characters."""
    text = message.get("content") if isinstance(message, dict) else message
    text = str(text)
    return repr(text if len(text) <= 40 else text[:39] + "…")


def write_compare_png(runs: list[RunRecord], metrics: list[str], out: str | Path) -> Path:
    """Write :func:`compare_figure` to ``out``, beside it first and renamed over it; a ConfigError
    naming it when it cannot be written."""
    fig = compare_figure(runs, metrics)
    out = Path(out)
    try:
        replace_file(out, lambda f: fig.savefig(f, dpi=90, format="png"))
    except OSError as exc:
        raise ConfigError(f"could not write --png {str(out)!r}: {exc.strerror or exc}") from None
    return out
