"""Fixtures of the simulator's own tests: a fresh cluster per test and
kubernetes clients built from its kubeconfig."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from . import SimCluster


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimCluster]:
    """A running simulated cluster with short back-offs."""
    with SimCluster.start(tmp_path / "sim") as cluster:
        cluster.configure(job_backoff_s=0.2, crash_backoff_s=0.2, image_pull_backoff_s=0.2)
        yield cluster


@pytest.fixture
def api_client(sim: SimCluster) -> Iterator[Any]:
    """A kubernetes ApiClient on the token context."""
    c = sim.api_client()
    yield c
    c.close()


@pytest.fixture
def core(api_client: Any) -> Any:
    """CoreV1Api over the kubeconfig."""
    return client.CoreV1Api(api_client)


@pytest.fixture
def batch(api_client: Any) -> Any:
    """BatchV1Api over the kubeconfig."""
    return client.BatchV1Api(api_client)
