"""A daemon killed at each step of a local run's life, without GPUs: after a
restart every run still executes once, keeps its runner's outcome and its
last lines, and leaves no pending file (see harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.supervisord.crashpoints.harness import Case, check_invariants, configure, crashed, job_command
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: The steps a plain local run passes (in order).
RUN_POINTS = (
    "submit.pending_written",
    "submit.recorded",
    "admit.recorded",
    "start.locked",
    "start.spawned",
    "start.handle_recorded",
    "start.pending_removed",
    "phase.running_recorded",
    "final.status_seen",
    "final.lines_recorded",
    "terminal.recorded",
    "resources.freed",
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})


def drive_runs(js: JobsupEnv, repo: Path, tmp_path: Path, point: str, *, gpus: bool) -> Case:
    """Runs through a daemon that dies at ``point``, then a restart.
    Without GPUs: one run. With ``gpus`` (one GPU, one per run): two runs
    before the crash and one after the restart, all wanting the one GPU.
    Returns the case, its daemon restarted."""
    configure(js, gpus=gpus)
    case = Case(js, point, tmp_path / "execs")
    case.start_crashing()
    flags = ["--gpus", "1"] if gpus else []
    for name in ("a", "b") if gpus else ("a",):
        if case.submit(repo, "--name", name, *flags, "--env", "TOKEN=s3cret", "--", job_command(case.execs)) is None:
            break
    crashed(js)
    case.restart()
    if gpus:
        case.submit(repo, "--name", "c", *flags, "--", job_command(case.execs))
    return case


@pytest.mark.parametrize("point", RUN_POINTS)
def test_run_survives_a_crash_at(js: JobsupEnv, repo: Path, tmp_path: Path, point: str) -> None:
    case = drive_runs(js, repo, tmp_path, point, gpus=False)
    check_invariants(case)
