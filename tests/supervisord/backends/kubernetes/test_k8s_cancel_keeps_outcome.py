"""W13 for Kubernetes: a cancel of a run whose Job had already failed
returns the Job's outcome (phase, reason, exit code), not CANCELED.

Deterministic: the Job fails while no supervisor follows it (as during a
daemon restart); the cancel comes right after a supervisor reattaches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s_sim import SimCluster
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import job_manifest, sim_cluster
from tests.supervisord.backends.kubernetes.k8s_supervisor_env import k8s_env

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

M = ".jobsup/k8s.yaml"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    with sim_cluster(tmp_path_factory.mktemp("sim")) as cluster:
        yield cluster


def _failed(sim: SimCluster, job: str) -> bool:
    conditions = ((sim.get_object("jobs.batch", job) or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Failed" and c.get("status") == "True" for c in conditions)


async def test_cancel_of_a_job_that_already_failed_keeps_its_outcome(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo started; sleep 1; exit 5", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING")
    sim.wait_for(lambda: _failed(sim, f"t-{run_id}"), timeout=60, what="the Job's failure")
    async with k8s_env(tmp_path, sim, reattach=True) as env:
        canceled = await env.supervisor.cancel(run_id)
        assert (canceled.phase, canceled.reason, canceled.exit_code) == ("ERROR", "NonZeroExit", 5), canceled
        assert "CANCELED" not in [p for p, _ in await env.phases(run_id)]
