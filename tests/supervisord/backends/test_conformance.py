"""Every backend passes the same scenarios (see conformance.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from supervisord.daemon.backends.local import LocalBackend
from tests.k8s_sim import SimCluster
from tests.supervisord.backends.conformance import SCENARIOS, BackendHarness, SupervisorHarness
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import (
    MANIFEST_PATH,
    job_manifest,
    kube_config,
    make_backend,
    sim_cluster,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def k8s_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    """One simulated cluster for every Kubernetes scenario of this module."""
    with sim_cluster(tmp_path_factory.mktemp("k8s-sim")) as sim:
        yield sim


def _kubernetes(request: pytest.FixtureRequest) -> BackendHarness:
    sim: SimCluster = request.getfixturevalue("k8s_sim")
    return BackendHarness(
        name="kubernetes",
        make=lambda: make_backend(sim),
        config=kube_config(sim),
        repo_files={MANIFEST_PATH: job_manifest()},
        submitted={"manifest": MANIFEST_PATH},
        stderr_stream="stdout",
    )


HARNESSES: dict[str, Callable[[pytest.FixtureRequest], BackendHarness]] = {
    "local": lambda request: BackendHarness(name="local", make=lambda: LocalBackend(kill_grace_s=2)),
    "kubernetes": _kubernetes,
}


@pytest.fixture(params=sorted(HARNESSES))
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SupervisorHarness]:
    async for h in SupervisorHarness.open(tmp_path, HARNESSES[request.param](request)):
        yield h


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_backend_conformance(harness: SupervisorHarness, scenario: str) -> None:
    await SCENARIOS[scenario](harness)
