"""The ``agentrl`` command: thin wrappers that parse, call the library, and print.

One module per command group: ``train`` (:mod:`agentrl.cli.train`), ``eval``
(:mod:`agentrl.cli.eval`), ``new`` (:mod:`agentrl.cli.new`); ``plugins`` and ``plot`` are here. What
they share (consoles, ``--debug``, one-line errors) is :mod:`agentrl.cli.support`.
"""

from __future__ import annotations

import json
import sys

import typer
from rich.markup import escape
from rich.table import Table

from agentrl.api.progress import noise_note, standard_error
from agentrl.cli.compare import compare
from agentrl.cli.eval import eval_
from agentrl.cli.new import app as new_app
from agentrl.cli.support import (
    LIBRARY_WARNINGS,
    DisablePluginOption,
    PluginOption,
    console,
    error_console,
    filter_library_warnings,
    plugin_manager,
    run_guarded,
    state,
)
from agentrl.cli.train import parse_rewards as _parse_rewards
from agentrl.cli.train import train
from agentrl.cli.view import view

__all__ = [
    "LIBRARY_WARNINGS",
    "app",
    "filter_library_warnings",
    "main",
    "noise_note",
    "plot",
    "plugins",
    "standard_error",
    "_parse_rewards",
]

app = typer.Typer(
    rich_markup_mode=None,
    help="Train LLM agents with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    """agentrl: plugin-based RL for LLM agents."""
    state["debug"] = debug
    filter_library_warnings()


def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
    plugin: PluginOption = None,
    disable_plugin: DisablePluginOption = None,
) -> None:
    """Installed plugins (and any --plugin) and what each registers."""

    def run() -> None:
        manager = plugin_manager(disable_plugin, plugin)
        rows = [
            {
                "name": p.name,
                "module": p.module,
                "distribution": p.distribution,
                "version": p.version,
                "registers": p.registered,
            }
            for p in manager.plugins.values()
        ]
        if as_json:
            print(json.dumps(rows, indent=2))
            return
        table = Table("plugin", "package", "registers")
        for row in rows:
            regs = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in row["registers"].items())
            table.add_row(row["name"], f"{row['distribution'] or '-'} {row['version'] or ''}", regs or "(hooks only)")
        console.print(table)

    run_guarded(run)


def plot(run_dir: str = typer.Argument(..., help="Run directory with metrics.jsonl.")) -> None:
    """Write PNG plots of a run (training.png in the run dir)."""

    def run() -> None:
        import warnings

        from agentrl.rundir.plots import plot_run

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = plot_run(run_dir)
        for warning in caught:
            error_console.print(f"[bold yellow]warning:[/] {escape(str(warning.message))}", highlight=False)
        console.print(f"wrote {out}", highlight=False)

    run_guarded(run)


app.command()(train)
app.command("eval")(eval_)
app.command()(plugins)
app.command()(plot)
app.command()(compare)
app.command()(view)
app.add_typer(new_app, name="new")

if __name__ == "__main__":
    sys.exit(app())
