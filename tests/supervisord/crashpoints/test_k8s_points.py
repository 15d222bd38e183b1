"""A daemon killed at each step of a Kubernetes run's start (the simulated
cluster, tests/k8s_sim): after a restart the run executes at most once
(exactly once when it completes), ends in a terminal phase and leaves no
pending file (see harness.py). A start cut off before its objects were
recorded as created is undone (``SubmitInterrupted``): the job never ran."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s_sim import SimCluster
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import MANIFEST_PATH, job_manifest, sim_cluster, use_sim
from tests.supervisord.crashpoints.harness import Case, Execs, check_invariants, crashed, job_command
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

#: point -> the phase the run ends in.
K8S_POINTS = {
    "submit.pending_written": "COMPLETED",  # not recorded: no run (the one after the restart completes)
    "submit.recorded": "COMPLETED",
    "admit.recorded": "COMPLETED",
    "k8s.handle_planned": "ERROR",
    "k8s.objects_created": "ERROR",
    "k8s.staged": "COMPLETED",
    "start.handle_recorded": "COMPLETED",
    "start.pending_removed": "COMPLETED",
    "phase.running_recorded": "COMPLETED",
    "terminal.recorded": "COMPLETED",
    "resources.freed": "COMPLETED",
}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    with sim_cluster(tmp_path_factory.mktemp("sim")) as cluster:
        yield cluster


@pytest.fixture
def execs() -> Iterator[Path]:
    """Where the jobs note their executions: outside ``/tmp``, which each
    simulated container has a private one of."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("needs a writable /dev/shm (the simulated containers' /tmp is private)")
    folder = Path(tempfile.mkdtemp(prefix="jobsup-crash-", dir="/dev/shm"))
    yield folder / "execs"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {MANIFEST_PATH: job_manifest(), "README": "x\n"})


@pytest.mark.parametrize("point", list(K8S_POINTS))
def test_kubernetes_run_survives_a_crash_at(
    js: JobsupEnv, sim: SimCluster, repo: Path, execs: Path, point: str
) -> None:
    use_sim(js, sim, pod_ready_timeout_s=20)
    case = Case(js, point, execs)
    case.start_crashing()
    first = case.submit(
        repo, "--backend", "kubernetes", "--name", "a", "--env", "TOKEN=s3cret", "--",
        job_command(case.execs, key="a"),
    )  # fmt: skip
    crashed(js)
    case.restart()
    # A run after the restart: the daemon starts runs again.
    case.submit(repo, "--backend", "kubernetes", "--name", "b", "--", job_command(case.execs, key="b"))
    ids = dict.fromkeys([first] if first else [], K8S_POINTS[point])
    runs = check_invariants(case, expect=ids)
    if K8S_POINTS[point] == "ERROR" and first:
        assert runs[first]["reason"] == "SubmitInterrupted", runs[first]
        assert "a" not in Execs.read(execs).runs, "a start that was undone ran its command"
