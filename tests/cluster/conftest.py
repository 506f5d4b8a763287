"""A real multi-node Ray cluster on this host (``ray.cluster_utils.Cluster``: one raylet per
node, each with resources of its own) standing in for several machines: a head node where the
driver runs, a ``trainer`` node, an ``engine`` node and an ``env`` node. Tests place roles on
them by custom resources and check each role's node id."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

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


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[SimulatedCluster]:
    """Four raylets on this host, the test process connected to it as a driver; shut down at the end."""
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
