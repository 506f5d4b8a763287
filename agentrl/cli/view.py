"""``agentrl view RUN_DIR [RUN_DIR ...]``: the runs' curves and episodes in the browser.

The page is built by :mod:`agentrl.viewer`; this module parses, prints and serves.
"""

from __future__ import annotations

import signal
from pathlib import Path

import typer
from rich.markup import escape

from agentrl.cli.support import console, run_guarded


def view(
    runs: list[str] = typer.Argument(
        ..., help="One or more run dirs (their curves overlaid, their episodes browsable)."
    ),
    out: str | None = typer.Option(
        None, "--out", help="Write the page here. Default: view.html in the first run dir (not written with --serve)."
    ),
    serve: bool = typer.Option(False, "--serve", help="Serve the page on http://127.0.0.1:PORT until Ctrl-C."),
    port: int = typer.Option(8765, "--port", help="The port --serve listens on (0: any free one)."),
) -> None:
    """Write one self-contained HTML page showing the runs: every metric's curve, every training
    and evaluation episode (conversation, tokens coloured by what was trained), evaluations of
    the same task side by side. Opens from disk, no server needed; --serve serves it instead."""
    server = run_guarded(lambda: _build(runs, out, serve, port))
    if server is None:
        return
    # Ctrl-C stops it even when whatever started this process ignored SIGINT (Python then installs
    # no handler of its own): a test runner's worker, a launcher script.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    host, bound = server.server_address[:2]
    console.print(f"serving http://{host}:{bound}/ (Ctrl-C stops)", highlight=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped", highlight=False)
    finally:
        server.server_close()


def _build(paths: list[str], out: str | None, serve: bool, port: int) -> object | None:
    """Build the page; write it (printing its path and file:// URL) and/or return a server for it."""
    from agentrl.errors import ConfigError
    from agentrl.viewer import build_payload, make_server, render_page, write_page

    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: must be 0-65535 (0: any free port)")
    payload = build_payload(paths)
    text = render_page(payload)
    episodes = sum(len(run["episodes"]) + len(run["eval_episodes"]) for run in payload["runs"])
    if out is not None or not serve:
        written = write_page(text, Path(out) if out is not None else Path(paths[0]) / "view.html")
        size = written.stat().st_size / 1e6
        console.print(f"wrote {escape(str(written))} ({size:.1f} MB, {episodes} episodes)", highlight=False)
        console.print(escape(written.as_uri()), highlight=False)
    return make_server(text, port) if serve else None
