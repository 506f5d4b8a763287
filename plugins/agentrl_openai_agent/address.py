"""Addresses of the ``openai_agent`` endpoint: which bind only this machine, which every
interface, this machine's IP as others see it, and the address agents are given."""

from __future__ import annotations

import ipaddress
import socket
import sys


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.x.x.x``, ``::1``, ``localhost``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every interface (``0.0.0.0``, ``::``)."""
    return host.strip("[]") in ("0.0.0.0", "::", "")


def machine_ip() -> str:
    """This machine's address as other machines see it: the Ray node's IP in a Ray run, else the
    address of the interface that routes outwards (no packet is sent), else its hostname's."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return str(sys.modules["ray"].util.get_node_ip_address())
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.254.254.254", 1))
            return str(probe.getsockname()[0])
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def advertised_host(host: str, advertise_host: str | None) -> str:
    """The address in the URLs agents are given: ``advertise_host`` when set, this machine's IP
    when ``host`` is a wildcard, else ``host`` itself."""
    if advertise_host:
        return advertise_host
    return machine_ip() if is_wildcard(host) else host


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
