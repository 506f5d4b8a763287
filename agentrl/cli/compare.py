"""``agentrl compare RUN_A RUN_B [RUN_C ...]``: runs side by side, and where they first differ.

The logic (reading, aligning, the identity check, the plot) is :mod:`agentrl.rundir.compare`; this
module parses, prints and sets the exit status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentrl.cli.support import console, run_guarded


def compare(
    runs: list[str] = typer.Argument(
        ..., help="Two or more run dirs; the first is the one the others are checked against."
    ),
    metric: list[str] | None = typer.Option(
        None,
        "--metric",
        help="Metric to show (repeatable; patterns such as 'reward/*' allowed). Default: the key ones.",
    ),
    every: bool = typer.Option(False, "--all", help="Show every metric the runs logged."),
    tolerance: float = typer.Option(
        0.0, "--tolerance", help="Numbers this close (absolute) count as equal in the identity check. Default: exactly."
    ),
    check: bool = typer.Option(False, "--check", help="Exit with status 1 when a run differs from the first."),
    png: str | None = typer.Option(
        None, "--png", help="Also write a PNG here: one panel per metric shown, a line per run."
    ),
) -> None:
    """Metrics of runs side by side, held-out accuracy before -> after, and the first step and metric
    where each run differs from the first (perf/* and other timing figures left out). Exit status 0;
    with --check, 1 when a run differs; 2 on bad input."""
    differs = run_guarded(lambda: _compare(runs, metric or [], every, tolerance, png))
    if check and differs:
        raise typer.Exit(code=1)


def _compare(paths: list[str], wanted: list[str], every: bool, tolerance: float, png: str | None) -> bool:
    """Print the table and the identity check (and write the PNG); whether any run differs from the first."""
    from agentrl.errors import ConfigError
    from agentrl.rundir.compare import choose_metrics, compare_pair, load_run, write_compare_png

    if len(paths) < 2:
        raise ConfigError(f"agentrl compare needs two or more run dirs, got {len(paths)}")
    if not tolerance >= 0:
        raise ConfigError(f"--tolerance {tolerance}: must be a number >= 0 (0: exactly equal)")
    if png and not Path(png).parent.is_dir():
        raise ConfigError(f"--png {png!r}: folder {str(Path(png).parent)!r} does not exist")
    runs = [load_run(path) for path in paths]
    metrics = choose_metrics(runs, wanted, every)
    labels = [run.name for run in runs]
    if len(set(labels)) < len(labels):
        labels = [str(run.path) for run in runs]
    table = _table(runs, labels, metrics)
    # Its full width even in a narrow terminal or a log file: a cut metric name or value would mislead.
    wide = console.measure(table, options=console.options.update_width(10_000)).maximum
    Console(width=max(console.width, wide), soft_wrap=True).print(table)
    differs = False
    for label, run in zip(labels[1:], runs[1:]):
        identity = compare_pair(runs[0], run, tolerance)
        differs |= not identity.identical
        prefix = f"{label} vs {labels[0]}: " if len(runs) > 2 else ""
        console.print(escape(prefix + identity.describe()), highlight=False)
    if png:
        console.print(f"wrote {escape(str(write_compare_png(runs, metrics, png)))}", highlight=False)
    return differs


def _table(runs: list[Any], labels: list[str], metrics: list[str]) -> Table:
    """Each metric at a few steps (the last included), a column per run; then held-out accuracy
    before -> after from each run's eval.json."""
    from agentrl.rundir.compare import shown_steps

    table = Table("metric", "step", *(escape(label) for label in labels))
    for metric in metrics:
        for number, step in enumerate(shown_steps(runs, metric)):
            cells = [_cell(run.steps.get(step, {}), metric) for run in runs]
            table.add_row(escape(metric) if number == 0 else "", str(step), *cells)
        table.add_section()
    accuracy = [_before_after(run.evals) for run in runs]
    if any(accuracy):
        table.add_row("held-out accuracy", "before -> after", *(a or "-" for a in accuracy))
    return table


def _cell(row: dict[str, Any], metric: str) -> str:
    """A metric's value for the table: "-" when not logged at that step, "nan" when logged without a number."""
    if metric not in row:
        return "-"
    value = row[metric]
    if value is None:
        return "nan"
    return f"{value:.6g}" if isinstance(value, float) else escape(str(value))


def _before_after(evals: dict[str, dict[str, Any]]) -> str:
    """eval.json's held-out accuracy as "before -> after" ("" when neither was measured)."""
    before, after = (evals[when].get("eval/accuracy") for when in ("before", "after"))
    if before is None and after is None:
        return ""
    return " -> ".join("-" if v is None else f"{v:.4g}" for v in (before, after))
