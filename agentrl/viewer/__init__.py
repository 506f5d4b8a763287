"""``agentrl view``: a run viewer in the browser (docs/guides/viewer.md). :mod:`agentrl.viewer.payload`
reads run dirs into the page's data; :mod:`agentrl.viewer.page` builds the self-contained HTML page
from it and the scripts in ``static/``, and serves it on localhost."""

from agentrl.viewer.page import make_server, render_page, write_page
from agentrl.viewer.payload import build_payload

__all__ = ["build_payload", "make_server", "render_page", "write_page"]
