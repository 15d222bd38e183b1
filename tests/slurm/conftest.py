"""Fixtures of the Slurm tests: the cluster (or a skip) and a transport."""

from __future__ import annotations

import pytest

from tests.slurm.slurm_env import TRANSPORTS, SlurmCluster, cluster_or_skip


@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    return cluster_or_skip()


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)
