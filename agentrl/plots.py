"""PNG plots of a run dir's ``metrics.jsonl`` (matplotlib, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path

PANELS = (
    ("reward", ("reward/total_mean", "reward/env_mean", "reward/format_mean", "reward/tool_use_mean")),
    ("held-out accuracy", ("eval/accuracy", "eval/accuracy_sampled")),
    ("sampled tokens", ("rollout/sampled_tokens_mean",)),
    ("policy", ("policy/entropy", "kl", "clip/region")),
    ("turns and tools", ("rollout/turns_mean", "rollout/tool_calls_mean", "rollout/tool_error_rate",
                         "rollout/tool_success_frac", "eval/tool_success_frac")),
    ("seconds per step", ("perf/step_seconds", "perf/rollout_seconds", "perf/update_seconds")),
)


def plot_run(run_dir: str | Path) -> Path:
    """Write ``<run_dir>/training.png`` from ``metrics.jsonl`` and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = run_dir / "eval.json"
    if evals.is_file() and rows:  # before training at step 0, after it at the last step
        before_after = json.loads(evals.read_text())
        rows = [{"step": 0, **before_after["before"]}, *rows, {"step": rows[-1]["step"], **before_after["after"]}]
    env_keys = sorted({k for r in rows for k in r if k.startswith(("env/", "eval/env/"))})
    panels = [*PANELS, ("env figures", tuple(env_keys))] if env_keys else list(PANELS)
    fig, axes = plt.subplots(2, 4 if env_keys else 3, figsize=(20 if env_keys else 15, 8))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 60 else None, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = run_dir / "training.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
