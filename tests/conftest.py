"""Shared fixtures: the real SmolLM2 tokenizer, a tiny random model built in-process, a venv that
plugin packages are pip-installed into, and a plugin file that fails on purpose."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# pytest-xdist workers share the cores: each worker (and every process its tests start, which
# inherit the variable) sizes its OpenMP pool to its share, instead of every worker spinning one
# thread per core (on 2 cores with 2 workers that oversubscription cost ~25% of the wall time).
if os.environ.get("PYTEST_XDIST_WORKER"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, _workers))))

import pytest
from faulty_plugin import FAULTS
from xdist.scheduler import LoadScopeScheduling

from agentrl.model.loading import DEFAULT_MODEL, load_tokenizer
from agentrl.testing import build_tiny_model


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's real tokenizer and chat template (converted once into the cache)."""
    return load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved tiny model + the real tokenizer: usable anywhere ``--model`` is."""
    folder = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@dataclass(frozen=True)
class PluginVenv:
    """A venv layered over the test venv: what is pip-installed into it is seen by its ``python``
    alone, while agentrl and every other package come from the test venv."""

    python: Path

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pip ARGS`` into this venv (the test venv's pip, ``--python`` this venv's interpreter)."""
        return subprocess.run(
            [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "--python", str(self.python), *args],
            capture_output=True,
            text=True,
            timeout=600,
        )

    def agentrl(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``agentrl ARGS`` with this venv's interpreter: it sees what was installed here."""
        return subprocess.run(
            [str(self.python), "-m", "agentrl.cli.app", *args], cwd=cwd, capture_output=True, text=True, timeout=600
        )


@pytest.fixture
def plugin_venv(tmp_path) -> PluginVenv:
    """A fresh venv whose site-packages come first and the test venv's after them (a ``.pth`` adds
    them, editable installs included): a test pip-installs plugin packages into it, as a user
    installs them, while the tests running beside it keep seeing the test venv unchanged."""
    folder = tmp_path / "plugin-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
    (Path(purelib) / "_layered_over_the_test_venv.pth").write_text("\n".join(lines) + "\n")
    return PluginVenv(python)


@pytest.fixture
def faults(tmp_path) -> Iterator[Path]:
    """``FAULTS`` (tests/faulty_plugin.py) as ``tmp_path/faults.py``: name its envs and rewards as
    ``f"{faults}:Tasks"``. A call into it that the test abandoned while it hung ends with the test."""
    path = tmp_path / "faults.py"
    path.write_text(FAULTS)
    yield path
    (tmp_path / "release").write_text("")  # abandoned hung calls end now, not during later tests
    time.sleep(0.2)


# A real multi-node Ray cluster on this host (``ray.cluster_utils.Cluster``: one raylet per node,
# each with resources of its own) standing in for several machines: a head node where the driver
# runs, a ``trainer`` node, an ``engine`` node and an ``env`` node. Tests place roles on them by
# custom resources and check each role's node id (tests/cluster/).

NODES = {
    "head": {"num_cpus": 2, "resources": {"head": 1}},
    "trainer": {"num_cpus": 2, "resources": {"trainer": 2}},
    "engine": {"num_cpus": 2, "resources": {"engine": 2}},
    "env": {"num_cpus": 4, "resources": {"env": 4}},
}
"""Node name -> its raylet's resources (logical: Ray's CPUs are an account, not cores)."""


class SimulatedCluster:
    """The cluster: its address (``ray.address``) and node ids by name."""

    def __init__(self, cluster: Any, node_ids: dict[str, str]) -> None:
        self.cluster, self.node_ids = cluster, node_ids

    @property
    def address(self) -> str:
        """What ``ray start --address`` and ``ray.address`` take."""
        return self.cluster.address

    def name_of(self, node_id: str) -> str:
        """Which of :data:`NODES` has ``node_id``."""
        return next(name for name, known in self.node_ids.items() if known == node_id)


RAY_TESTS = "tests/cluster/"
"""Where every test that uses :func:`ray_cluster` lives: under pytest-xdist they all run on one
worker (:func:`pytest_xdist_make_scheduler`), so the cluster starts once (~45 s on 2 cores) and one
4-raylet cluster runs at a time, instead of one per worker."""


class _RayTestsOnOneWorker(LoadScopeScheduling):
    """xdist's ``load`` distribution, except that the tests under :data:`RAY_TESTS` are one work
    unit (handed to one worker, the biggest unit first); every other test is a unit of its own."""

    def _split_scope(self, nodeid: str) -> str:
        return RAY_TESTS if nodeid.startswith(RAY_TESTS) else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """``-n N`` (xdist's default ``--dist load``) keeps the Ray tests on one worker; an explicit
    other ``--dist`` is left as asked. (xdist's own ``--dist loadgroup`` cannot do it here: it
    renames nodes through an attribute pytest 9 no longer reads.)"""
    if config.getoption("dist") != "load":
        return None
    return _RayTestsOnOneWorker(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test outside :data:`RAY_TESTS` that uses ``ray_cluster`` would start a second cluster on
    another worker: refused, naming it."""
    strays = [
        item.nodeid
        for item in items
        if "ray_cluster" in getattr(item, "fixturenames", ()) and not item.nodeid.startswith(RAY_TESTS)
    ]
    if strays:
        raise pytest.UsageError(f"tests using ray_cluster must live under {RAY_TESTS}: {', '.join(strays)}")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[SimulatedCluster]:
    """Four raylets on this host, the test process connected to it as a driver; shut down at the end."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    head = NODES["head"]
    cluster = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False})
    node_ids = {"head": cluster.head_node.node_id}
    for name, args in NODES.items():
        if name != "head":
            node_ids[name] = cluster.add_node(**args).node_id
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", include_dashboard=False)
    try:
        yield SimulatedCluster(cluster, node_ids)
    finally:
        ray.shutdown()
        cluster.shutdown()
