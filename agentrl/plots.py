"""PNG plots of a run dir's ``metrics.jsonl`` (matplotlib, no display needed)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

PANELS = (
    ("reward", ("reward/total_mean", "reward/env_mean", "reward/format_mean", "reward/tool_use_mean")),
    ("held-out accuracy", ("eval/accuracy", "eval/accuracy_sampled")),
    ("sampled tokens", ("rollout/sampled_tokens_mean",)),
    ("policy", ("policy/entropy", "kl", "clip/region")),
    ("turns and tools", ("rollout/turns_mean", "rollout/tool_calls_mean", "rollout/tool_error_rate",
                         "rollout/tool_success_frac", "eval/tool_success_frac")),
    ("seconds per step", ("perf/step_seconds", "perf/rollout_seconds", "perf/update_seconds")),
)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/metrics.jsonl``. A missing run dir or file, an empty file or a broken
    line is a ConfigError naming it; a torn last line (a run killed mid-write) is skipped with a warning."""
    if not run_dir.is_dir():
        raise ConfigError(f"run dir {str(run_dir)!r} {'is a file' if run_dir.exists() else 'does not exist'}: "
                          "expected the folder a training run wrote")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} not found: is {str(run_dir)!r} a run dir? (a run writes it after its "
                          "first step)")
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
    return {k: v for k, v in data.items() if k in ("before", "after") and isinstance(v, dict)} if isinstance(
        data, dict) else {}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plot_run(run_dir: str | Path) -> Path:
    """Write ``<run_dir>/training.png`` from ``metrics.jsonl`` and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    evals = _read_evals(run_dir / "eval.json")  # before training at step 0, after it at the last step
    rows = [*([{**evals["before"], "step": 0}] if "before" in evals else []), *rows,
            *([{**evals["after"], "step": rows[-1]["step"]}] if "after" in evals else [])]
    env_keys = sorted({k for r in rows for k in r if k.startswith(("env/", "eval/env/"))})
    panels = [*PANELS, ("env figures", tuple(env_keys))] if env_keys else list(PANELS)
    fig, axes = plt.subplots(2, 4 if env_keys else 3, figsize=(20 if env_keys else 15, 8))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if _is_number(r.get(key))]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 60 else None, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = run_dir / "training.png"
    try:
        fig.savefig(out, dpi=90)
    except OSError as exc:
        raise ConfigError(f"could not write {out}: {exc}") from None
    finally:
        plt.close(fig)
    return out
