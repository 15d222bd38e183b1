"""Retries of Kubernetes runs on the simulator (supervisord.shared.retry): a run
whose pod is evicted is retried as a new Job ``<name>-a2`` (the contract's
``backoffLimit: 0`` stays: jobsup owns the policy) with its own env Secret,
and ends with the second attempt's outcome; each attempt's lines once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
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


async def test_an_evicted_pod_is_retried_as_job_a2(tmp_path: Path, sim: SimCluster) -> None:
    # The first attempt waits (its pod gets evicted); the second, in Job
    # t-<run>-a2 (its pods are named after it), completes.
    command = 'echo "attempt on $HOSTNAME"; case "$HOSTNAME" in *-a2-*) echo done ;; *) sleep 60 ;; esac'
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            command,
            manifest=M,
            files={M: job_manifest()},
            env={"TOKEN": "s3cret"},
            retry={"attempts": 1, "on": ["Evicted"], "backoff_s": 0.0},
        )
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
        first = sim.wait_for(lambda: sim.pod_of_job(f"t-{run_id}"), what="the first pod")
        sim.evict_pod(str(first["metadata"]["name"]))
        run = await env.terminal(run_id)
        assert (run.phase, run.reason, run.attempt) == ("COMPLETED", None, 2), run
        second = sim.wait_for(lambda: sim.pod_of_job(f"t-{run_id}-a2"), what="the second attempt's pod")
        ended = await env.events(run_id, "AttemptEnded")
        assert [(e.data["attempt"], e.data["reason"]) for e in ended] == [(1, "Evicted")]
        assert [e.data["attempt"] for e in await env.events(run_id, "AttemptStarted")] == [2]
        created = [(e.data["kind"], e.data["name"]) for e in await env.events(run_id, "ObjectCreated")]
        assert created == [
            ("Secret", f"jobsup-env-{run_id}"),
            ("Job", f"t-{run_id}"),
            ("Secret", f"jobsup-env-{run_id}-a2"),
            ("Job", f"t-{run_id}-a2"),
        ]
        assert await env.lines(run_id) == [
            f"attempt on {first['metadata']['name']}",
            f"attempt on {second['metadata']['name']}",
            "done",
        ]
        # The Job's own policy stays jobsup's: backoffLimit 0 on both.
        for job in (f"t-{run_id}", f"t-{run_id}-a2"):
            obj = sim.get_object("jobs.batch", job)
            assert obj is not None and obj["spec"]["backoffLimit"] == 0
        phases = await env.phases(run_id)
        assert ("RUNNING", "Retrying") in phases and phases[-1] == ("COMPLETED", None)


async def test_a_cancel_between_attempts_deletes_every_attempts_objects(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo started; sleep 60",
            manifest=M,
            files={M: job_manifest()},
            retry={"attempts": 3, "on": ["Evicted"], "backoff_s": 3600.0},
        )
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
        first = sim.wait_for(lambda: sim.pod_of_job(f"t-{run_id}"), what="the first pod")
        sim.evict_pod(str(first["metadata"]["name"]))
        await env.wait_until(run_id, lambda r: r.reason == "Retrying")
        with anyio.fail_after(30):
            run = await env.supervisor.cancel(run_id)
        assert (run.phase, run.reason, run.attempt) == ("CANCELED", "Canceled", 1)
