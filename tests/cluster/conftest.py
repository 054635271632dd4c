"""The three-node KRaft cluster of the tests in this folder (session scope): started from
scripts/kafka_cluster.sh in a fresh state dir on ``IOLSTREAM_TEST_CLUSTER_PORT`` (default 19492: nodes on
19492, 19494, 19496, controllers on the next ports), wiped at the end. A node a test killed is started again
before the next test."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_util import wait_for_broker

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "scripts" / "kafka_cluster.sh"


class Cluster:
    """A running cluster: its bootstrap servers, and each node's pid, kill and restart."""

    def __init__(self, port: int, state_dir: Path):
        self.port = port
        self.state_dir = state_dir
        self.nodes = 3

    def sh(self, *args: str, timeout: float = 600.0, check: bool = True) -> str:
        env = {
            **os.environ,
            "KAFKA_CLUSTER_PORT": str(self.port),
            "IOLSTREAM_KAFKA_CLUSTER_DATA": str(self.state_dir),
        }
        r = subprocess.run(
            ["bash", str(CLUSTER_SH), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"kafka_cluster.sh {' '.join(args)} failed (exit {r.returncode}):\n{r.stderr}")
        return r.stdout.strip()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + 2 * i}" for i in range(self.nodes))

    def node_of_port(self, port: int) -> int:
        return (port - self.port) // 2 + 1

    def pid(self, node: int) -> int:
        return int((self.state_dir / f"node-{node}" / "kafka.pid").read_text())

    def kill(self, node: int) -> None:
        self.sh("kill", str(node))

    def rss_bytes(self) -> int:
        """Resident memory of the nodes now running, summed."""
        total = 0
        for node in range(1, self.nodes + 1):
            try:
                status = Path(f"/proc/{self.pid(node)}/status").read_text()
            except (OSError, ValueError):
                continue
            total += next(
                int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")
            )
        return total

    def heal(self) -> None:
        """Start every node that is down and wait until the cluster lists all of them."""
        if self.sh("status", check=False).count("running") < self.nodes:
            self.sh("start")
        wait_for_broker(self.bootstrap, timeout=60)


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory, worker_kernels) -> Iterator[Cluster]:
    cluster = Cluster(
        int(os.environ.get("IOLSTREAM_TEST_CLUSTER_PORT", "19492")), tmp_path_factory.mktemp("cluster")
    )
    try:
        cluster.sh("start")
        yield cluster
    finally:
        cluster.sh("wipe", check=False)


@pytest.fixture
def cluster(kafka_cluster) -> Cluster:
    kafka_cluster.heal()
    return kafka_cluster
