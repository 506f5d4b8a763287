"""PNG plots of a run dir's ``metrics.jsonl`` (matplotlib, no display needed)."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError
from agentrl.rundir.links import replace_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Panel:
    """One subplot of ``training.png``."""

    title: str
    keys: tuple[str, ...]
    """Metric keys drawn against the left y axis."""
    right: tuple[str, ...] = ()
    """Keys drawn against a second, right y axis (another scale, e.g. explained variance beside a loss)."""
    optional: bool = False
    """Drawn only when the run logged one of its keys (PPO's critic: GRPO has none)."""
    undefined: str = ""
    """Written in the panel when one of its keys was logged at every step without a number (a
    NaN, which metrics.jsonl holds as null)."""


PANELS = (
    Panel("reward", ("reward/total_mean", "reward/env_mean", "reward/format_mean", "reward/tool_use_mean")),
    Panel("held-out accuracy", ("eval/accuracy", "eval/accuracy_sampled")),
    Panel("sampled tokens", ("rollout/sampled_tokens_mean",)),
    Panel("policy", ("policy/entropy", "kl", "clip/region")),
    Panel(
        "critic (PPO)",
        ("loss/value",),
        right=("critic/explained_variance",),
        optional=True,
        undefined="explained variance undefined:\nthe returns never varied",
    ),
    Panel(
        "turns and tools",
        (
            "rollout/turns_mean",
            "rollout/tool_calls_mean",
            "rollout/tool_error_rate",
            "rollout/tool_success_frac",
            "eval/tool_success_frac",
        ),
    ),
    Panel("seconds per step", ("perf/step_seconds", "perf/rollout_seconds", "perf/update_seconds")),
)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/metrics.jsonl``. A missing run dir or file, an empty file or a broken
    line is a ConfigError naming it; a torn last line (a run killed mid-write) is skipped with a warning."""
    if not run_dir.is_dir():
        raise ConfigError(
            f"run dir {str(run_dir)!r} {'is a file' if run_dir.exists() else 'does not exist'}: "
            "expected the folder a training run wrote"
        )
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"{str(path)!r} not found: is {str(run_dir)!r} a run dir? (a run writes it after its first step)"
        )
    lines = [(n, line) for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if line.strip()]
    rows = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == lines[-1][0]:
                warnings.warn(f"{path}, line {n}: skipped a torn last line (the run stopped mid-write?)", stacklevel=2)
                continue
            raise ConfigError(f"{path}, line {n}: not valid JSON ({exc.msg}); fix or delete that line") from None
        if not isinstance(row, dict) or not _is_number(row.get("step")):
            raise ConfigError(f"{path}, line {n}: expected a JSON object with a numeric 'step', got {line[:60]!r}")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path} holds no metrics yet: nothing to plot")
    return rows


def _read_evals(path: Path) -> dict[str, Any]:
    """``eval.json``'s before/after metrics; {} with a warning when it is unreadable."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.warn(f"{path} is unreadable ({exc}); plotting without it", stacklevel=2)
        return {}
    return (
        {k: v for k, v in data.items() if k in ("before", "after") and isinstance(v, dict)}
        if isinstance(data, dict)
        else {}
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _eval_note(run_dir: Path, rows: list[dict[str, Any]]) -> str:
    """What the held-out panel says when it has no point: why there is no evaluation ("" if there is)."""
    if any(_is_number(r.get("eval/accuracy")) for r in rows):
        return ""
    try:
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict) and config.get("eval_tasks") == 0:
        return "no evaluation: eval_tasks=0"
    return "no evaluation recorded yet"


def run_figure(run_dir: str | Path) -> Figure:
    """The figure of ``training.png``: one panel per entry of ``PANELS`` (an optional one only when
    the run logged its metrics), then one for the env's own ``env/`` figures if it logged any; two
    rows of panels, 5 inches a column."""
    from matplotlib.figure import Figure  # no pyplot: no global figure registry, no backend switch

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    evals = _read_evals(run_dir / "eval.json")  # before training at step 0, after it at the last step
    rows = [
        *([{**evals["before"], "step": 0}] if "before" in evals else []),
        *rows,
        *([{**evals["after"], "step": rows[-1]["step"]}] if "after" in evals else []),
    ]
    logged = {k for r in rows for k, v in r.items() if _is_number(v)}
    null = {k for r in rows for k in r} - logged
    panels = [p for p in PANELS if not p.optional or logged & {*p.keys, *p.right}]
    env_keys = tuple(sorted(k for k in logged if k.startswith(("env/", "eval/env/"))))
    if env_keys:
        panels.append(Panel("env figures", env_keys))
    columns = max(3, math.ceil(len(panels) / 2))
    fig = Figure(figsize=(5 * columns, 8))
    axes = fig.subplots(2, columns)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        lines = _draw(ax, rows, panel.keys, first_color=0)
        if panel.right:  # each axis labelled with its keys, in its lines' colour: no legend over the lines
            right = ax.twinx()
            right_lines = _draw(right, rows, panel.right, first_color=len(lines))
            for side, keys, drawn in ((ax, panel.keys, lines), (right, panel.right, right_lines)):
                side.set_ylabel(", ".join(keys), fontsize=9, color=drawn[0].get_color() if drawn else "black")
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        if lines and not panel.right:
            ax.legend(handles=lines, fontsize=7)
        note = _eval_note(run_dir, rows) if panel.title == "held-out accuracy" else ""
        if panel.undefined and null & {*panel.keys, *panel.right}:
            note = panel.undefined
        if note:
            ax.text(
                0.5,
                0.5,
                note,
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="dimgray",
                bbox={"facecolor": "white", "edgecolor": "lightgray"},
            )
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    return fig


def _draw(ax: Any, rows: list[dict[str, Any]], keys: tuple[str, ...], first_color: int) -> list[Any]:
    """Plot each of ``keys`` that has numbers in ``rows`` on ``ax``; the lines drawn."""
    lines = []
    for key in keys:
        points = [(r["step"], r[key]) for r in rows if _is_number(r.get(key))]
        if points:
            lines += ax.plot(
                *zip(*points), marker="." if len(points) < 60 else None, label=key, color=f"C{first_color + len(lines)}"
            )
    return lines


def plot_run(run_dir: str | Path) -> Path:
    """Write ``<run_dir>/training.png`` (:func:`run_figure`) and return its path. It is written
    beside and renamed over the old one: a symbolic link there is replaced, never written through."""
    fig = run_figure(run_dir)
    out = Path(run_dir) / "training.png"
    try:
        replace_file(out, lambda f: fig.savefig(f, dpi=90, format="png"))
    except OSError as exc:
        raise ConfigError(f"could not write {out}: {exc}") from None
    return out
