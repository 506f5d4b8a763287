"""The viewer's page: one self-contained HTML file (the data inlined as JSON, the scripts and styles
from ``agentrl/viewer/static/`` inlined too), written to a file or served on localhost."""

from __future__ import annotations

import html
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.rundir.links import write_text
from agentrl.viewer.payload import page_json

STYLES = ("uPlot.min.css", "viewer.css")
"""The stylesheets, in order."""
SCRIPTS = ("uPlot.iife.min.js", "core.js", "curves.js", "episodes.js", "detail.js", "evals.js", "main.js")
"""The scripts, in order: uPlot (vendored, its LICENSE beside it), then the viewer's own."""


def static_text(name: str) -> str:
    """The text of the static file ``name`` shipped with the package."""
    return files("agentrl.viewer").joinpath("static", name).read_text(encoding="utf-8")


def render_page(payload: dict[str, Any]) -> str:
    """The whole page for ``payload`` (:func:`agentrl.viewer.payload.build_payload`), needing no
    server: opened from disk it shows everything."""
    for name in SCRIPTS:
        if "</script" in static_text(name).lower():  # would end its element early
            raise ConfigError(f"agentrl/viewer/static/{name} holds '</script': it cannot be inlined")
    title = "agentrl view: " + ", ".join(run["name"] for run in payload["runs"])
    styles = "\n".join(f"<style>\n{static_text(name)}\n</style>" for name in STYLES)
    scripts = "\n".join(f"<script>\n{static_text(name)}\n</script>" for name in SCRIPTS)
    return (
        "<!doctype html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n"
        f"<title>{html.escape(title)}</title>\n{styles}\n</head>\n<body>\n"
        '<div id="app">Loading...</div>\n'
        f'<script type="application/json" id="viewer-data">{page_json(payload)}</script>\n'
        f"{scripts}\n</body>\n</html>\n"
    )


def write_page(text: str, out: Path) -> Path:
    """Write ``text`` to ``out`` beside-and-rename (a link at ``out`` is replaced, never written
    through); its absolute path. A ConfigError naming ``out`` when its folder is missing or unwritable."""
    out = out.absolute()
    if not out.parent.is_dir():
        raise ConfigError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    try:
        write_text(out, text)
    except OSError as exc:
        raise ConfigError(
            f"could not write {str(out)!r}: {exc.strerror or exc}; pass --out FILE.html elsewhere"
        ) from None
    return out


def make_server(text: str, port: int) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:``port`` (0: any free port) answering every GET with the page; a
    ConfigError naming the port when it is taken."""
    body = text.encode("utf-8")

    class Handler(BaseHTTPRequestHandler):
        """Serves the page at any path."""

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            """The page, whatever the path."""
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            """Quiet: no line per request."""

    try:
        return ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:
        raise ConfigError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror or exc})") from None
