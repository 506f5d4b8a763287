"""docs/guides/multi-node.md's recipe runs as written, on this host: its ``ray start --head`` and
``ray start --address`` blocks (two raylets, the second with the ``trainer`` resource) and its
``agentrl train --ray --num-processes 2`` block (2 steps on a tiny model, the flags
tests/repo/test_docs.py appends to a ``docs-test: tiny`` block), process 1 on the second node.

The head's ports and temp dir are this test's own (the documented address is replaced by this
host's), so it does not clash with another cluster here; at the end the processes of this cluster
alone are ended (``ray stop`` would stop every Ray cluster of this user on the host)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guides" / "multi-node.md"
DOCUMENTED_ADDRESS = "10.0.0.1:6379"
_spec = importlib.util.spec_from_file_location("docs_snippets", ROOT / "tests" / "repo" / "test_docs.py")
assert _spec is not None and _spec.loader is not None
docs_snippets = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = docs_snippets  # its dataclasses look their module up
_spec.loader.exec_module(docs_snippets)


def recipe() -> dict[str, list[list[str]]]:
    """The doc's bash blocks by their first line (``# head``, ``# node``, ``# train``), as commands."""
    named = {}
    for block in docs_snippets.parse(DOC):
        first = block.code.splitlines()[0] if block.code.strip() else ""
        if block.lang == "bash" and first.startswith("# "):
            named[first[2:].strip()] = docs_snippets.commands(block.code)
    assert set(named) == {"head", "node", "train"}, named
    return named


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def cluster_processes(markers: list[str]) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if any(marker in line for marker in markers) and proc.pid != os.getpid():
            found.append(proc)
    return found


@pytest.fixture
def host() -> Iterator[dict[str, str]]:
    """This test's cluster's address and temp dir; its processes are ended at the end."""
    from ray._private.services import get_node_ip_address

    address = f"{get_node_ip_address()}:{free_port()}"
    temp = Path(tempfile.mkdtemp(prefix="agentrl-ray-"))  # short: Ray's socket paths live under it
    try:
        yield {"address": address, "temp": str(temp)}
    finally:
        procs = cluster_processes([str(temp), address])
        for proc in procs:
            proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


@pytest.mark.timeout(900)
def test_the_two_node_recipe_runs(host, tiny_model_dir, tmp_path):
    steps = recipe()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "AGENTRL_LAUNCHED": ""}  # the doc's private-network choice
    ray = str(Path(sys.executable).parent / "ray")
    port = host["address"].rsplit(":", 1)[1]

    def here(argv: list[str]) -> list[str]:
        return [item.replace(DOCUMENTED_ADDRESS, host["address"]).replace("=6379", f"={port}") for item in argv]

    own = ["--num-cpus=2", "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}"]
    (head,) = steps["head"]
    assert head[:3] == ["ray", "start", "--head"]
    run(
        [ray, *here(head)[1:], *own, f"--temp-dir={host['temp']}", "--include-dashboard=false"]
        + [f"--ray-client-server-port={free_port()}"],
        tmp_path,
        env,
    )
    (node,) = steps["node"]
    assert node[:2] == ["ray", "start"] and DOCUMENTED_ADDRESS in " ".join(node)
    own[-1] = f"--dashboard-agent-listen-port={free_port()}"
    run([ray, *here(node)[1:], *own], tmp_path, env)
    (train,) = steps["train"]
    assert train[:2] == ["agentrl", "train"]
    args = [*here(train)[1:], "--model", str(tiny_model_dir), *docs_snippets.TINY_FLAGS]
    done = run([sys.executable, "-m", "agentrl", *args, "--output-dir", str(tmp_path / "run")], tmp_path, env)
    banner = re.search(r"trainers: 0 on node (\w+) head \(([^)]+)\), 1 on node (\w+) \(([^)]+)\)", done.stdout)
    assert banner and banner.group(1) != banner.group(3), done.stdout[-3000:]
    assert "run saved to" in done.stdout and (tmp_path / "run" / "metrics.jsonl").is_file()
    deadline = time.monotonic() + 30
    while [p for p in cluster_processes([str(tmp_path / "run")]) if "agentrl" in " ".join(p.cmdline())]:
        assert time.monotonic() < deadline, "a trainer process outlived the run"
        time.sleep(0.5)
