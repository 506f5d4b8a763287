"""Where the ``openai_agent`` endpoint listens and what its agents are told, for local and remote
agent workers: the address resolved, the checks made before agents are handed URLs."""

from __future__ import annotations

from typing import Any

from agentrl import ConfigError, one_line
from agentrl_openai_agent.address import advertised_host, is_loopback, machine_ip, url_host
from agentrl_openai_agent.config import SECTION, OpenAIAgentConfig
from agentrl_openai_agent.remote import RemoteAgentWorkers, auto_host, check_bind
from agentrl_openai_agent.server import BackgroundServer


def open_endpoint(app: Any, options: OpenAIAgentConfig, workers: Any, warn: Any, check_reach: bool) -> BackgroundServer:
    """Serve ``app`` where ``options`` say (``host`` null: :func:`agentrl_openai_agent.remote.auto_host`
    with remote workers, else 127.0.0.1). A non-loopback address is said once (``warn(key, line)``):
    its traffic is plain HTTP. With remote ``workers``: ConfigError when they cannot reach it
    (:func:`agentrl_openai_agent.remote.check_bind`; ``check_reach``: each fetches its health route)."""
    remote = isinstance(workers, RemoteAgentWorkers)
    here = machine_ip() if remote else "127.0.0.1"
    host = options.host or (auto_host(here, workers.places) if remote else "127.0.0.1")
    if remote:
        check_bind(host, advertised_host(host, options.advertise_host), here, workers.places)
    try:
        server = BackgroundServer(app, host=host, port=options.port, advertise_host=options.advertise_host)
    except OSError as exc:
        raise ConfigError(
            f"plugins.{SECTION}.host={host!r}, port={options.port}: the endpoint cannot listen there "
            f"({one_line(exc)}); use 127.0.0.1, 0.0.0.0 or an IP of this machine's interfaces, and a free port (0: any)"
        ) from None
    if not is_loopback(host):
        warn(
            "endpoint:plain-http",
            f"openai_agent endpoint: listening on {url_host(host)}:{server.port} over plain HTTP (no TLS): prompts, "
            "replies and the run's secret URLs cross the network unencrypted; keep it on a network you trust",
        )
    if remote and check_reach:
        try:
            workers.check_reach(f"{server.root()}/health", f"{server.root(secret=False)}/health")
        except ConfigError:
            server.close()
            raise
    return server
