"""What every ``agentrl`` command shares: the consoles, ``--debug``, one-line errors and the
``--plugin`` / ``--disable-plugin`` options. The command modules import this; it imports none of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from agentrl.errors import AgentRLError

console = Console(stderr=False, soft_wrap=True)  # a log file gets whole lines, never re-wrapped
error_console = Console(stderr=True, soft_wrap=True)
state = {"debug": False}
"""``debug``: ``agentrl --debug`` was given (errors then raise with their traceback)."""

PluginOption = Annotated[
    list[str] | None, typer.Option("--plugin", help="Extra plugin to load: module.path or path/file.py.")
]
DisablePluginOption = Annotated[list[str] | None, typer.Option("--disable-plugin", help="Plugin not to load.")]

LIBRARY_WARNINGS = ((FutureWarning, r"`past_key_values` is deprecated"),)
"""(category, message start) of library warnings no agentrl user can act on. transformers >= 5.24
renamed a causal LM's ``past_key_values`` argument ``cache`` and warns at every decode of the hf
engine, which passes the old name (accepted until 5.40)."""


def filter_library_warnings() -> None:
    """Hide the warnings in ``LIBRARY_WARNINGS`` (and only those) for this process."""
    import warnings

    for category, message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def run_guarded(fn: Callable[[], Any]) -> Any:
    """Call ``fn``; an agentrl error (or ``sys.exit()`` in plugin code) becomes one line on stderr
    and exit status 2, unless ``--debug`` asks for the traceback."""
    try:
        return fn()
    except AgentRLError as exc:
        if state["debug"]:
            raise
        if not _said_by_process_0(exc):
            error_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    except SystemExit as exc:  # sys.exit() in plugin code outside a guarded call (agentrl never calls it)
        if state["debug"]:
            raise
        from agentrl.faults import raised_at

        error_console.print(
            f"[bold red]error:[/] {escape(repr(exc))} raised at {escape(raised_at(exc))}: plugin "
            "code may not end the run",
            highlight=False,
        )
        raise typer.Exit(code=2) from None


def _said_by_process_0(exc: AgentRLError) -> bool:
    """Whether process 0 of a launched run says this error too: a config error is found alike by
    every process, so only process 0 prints it (one line for the run)."""
    import os

    from agentrl.errors import ConfigError
    from agentrl.model.launch import OWN_ERRORS, process_rank

    return isinstance(exc, ConfigError) and process_rank() > 0 and not os.environ.get(OWN_ERRORS)


def plugin_manager(disabled: list[str] | None, modules: list[str] | None) -> Any:
    """The installed plugins less ``disabled`` (``--disable-plugin``), plus ``modules`` (``--plugin``)."""
    from agentrl.plugins import load_plugins

    return load_plugins(disabled=disabled or [], modules=modules or [])


def quiet_library_progress() -> None:
    """Silence transformers' own loading bars: they would break up agentrl's display."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
