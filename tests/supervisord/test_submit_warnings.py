"""Preflight warnings reach the user: ``jobsup submit`` prints them on stderr
(defect: they were computed by the backend and dropped by the supervisor)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s_sim import SimCluster
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import MANIFEST_PATH, job_manifest, sim_cluster, use_sim
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    with sim_cluster(tmp_path_factory.mktemp("sim")) as cluster:
        yield cluster


def test_submit_prints_the_preflight_notes(js: JobsupEnv, tmp_path: Path, sim: SimCluster) -> None:
    use_sim(js, sim)
    # A fixed Job name: the manifest check notes that a rerun would collide.
    repo = make_repo(tmp_path / "proj", {MANIFEST_PATH: job_manifest(name="train-fixed")})
    js.start_daemon()
    r = js.cli("submit", "--backend", "kubernetes", "--", "echo hi", cwd=repo)
    assert len(r.stdout.strip()) == 12, r.stdout
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert any("Job/train-fixed" in w and "AlreadyExists" in w for w in warnings), r.stderr
    js.cli("wait", r.stdout.strip(), "--timeout", "2m", check=False)


def test_submit_warns_when_the_daemon_config_became_invalid(js: JobsupEnv, tmp_path: Path) -> None:
    """A tester's finding: daemon.yaml edited into something invalid while
    the daemon runs broke nothing visible until the next start refused it."""
    path = js.daemon_config("retention: {archive_logs_after: 30d}\n")
    js.start_daemon()
    repo = make_repo(tmp_path / "proj", {"a.txt": "a\n"})

    def warnings() -> list[str]:
        r = js.cli("submit", "--force", "--", "true", cwd=repo)  # the last one may still be in flight
        assert len(r.stdout.strip()) == 12, r.stdout  # the submit itself goes through
        return [line for line in r.stderr.splitlines() if "daemon config" in line]

    assert warnings() == []
    path.write_text("retention: {archive_logs_after: soon}\n")
    [warning] = warnings()
    assert str(path) in warning and "archive_logs_after" in warning and "now invalid" in warning, warning
    assert warnings() == [warning]  # every submit, until it is fixed
    path.write_text("retention: {archive_logs_after: 7d}\n")
    assert warnings() == []


def test_rerun_prints_the_preflight_notes(js: JobsupEnv, tmp_path: Path, sim: SimCluster) -> None:
    """A rerun goes through the same submit pipeline as a submit: the
    backend's preflight warnings reach the user (defect: rerun dropped them)."""
    use_sim(js, sim)
    repo = make_repo(tmp_path / "proj", {MANIFEST_PATH: job_manifest(name="train-again")})
    js.start_daemon()
    first = js.cli("submit", "--backend", "kubernetes", "--", "echo hi", cwd=repo).stdout.strip()
    js.cli("wait", first, "--timeout", "2m", check=False)
    r = js.cli("rerun", first, cwd=repo)
    assert len(r.stdout.strip()) == 12 and r.stdout.strip() != first, r.stdout
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert any("Job/train-again" in w and "AlreadyExists" in w for w in warnings), r.stderr
    js.cli("wait", r.stdout.strip(), "--timeout", "2m", check=False)
