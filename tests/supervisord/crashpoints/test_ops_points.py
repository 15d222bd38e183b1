"""A daemon killed in the middle of a user's request: a cancel, a hold, a
release, a retention pass. After a restart (and the request made again,
as a user whose command said it lost the daemon would) every run executes
at most once and ends with its runner's outcome (see harness.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.supervisord.crashpoints.harness import (
    Case,
    check_invariants,
    client,
    configure,
    crashed,
    job_command,
    log_lines,
    wait_all,
)
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ONE_AT_A_TIME = "scheduler:\n  queues:\n    default: {max_parallel: 1}\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})


def _wait_phase(js: JobsupEnv, run_id: str, phase: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while client(js).show(run_id)["run"]["phase"] != phase:
        assert time.monotonic() < deadline, f"run {run_id} not {phase} in time"
        time.sleep(0.05)


def _in_background(js: JobsupEnv, *args: str) -> None:
    """The CLI with ``args``, not waited for (the daemon dies while it asks)."""
    threading.Thread(target=js.cli, args=args, kwargs={"check": False}, daemon=True).start()


@pytest.mark.parametrize("point", ["cancel.requested", "cancel.stopped"])
def test_cancel_survives_a_crash_at(js: JobsupEnv, repo: Path, tmp_path: Path, point: str) -> None:
    configure(js, gpus=False)
    case = Case(js, point, tmp_path / "execs")
    case.start_crashing()
    run_id = case.submit(repo, "--env", "TOKEN=s3cret", "--", job_command(case.execs, gate=tmp_path / "never"))
    assert run_id is not None
    _wait_phase(js, run_id, "RUNNING")
    _in_background(js, "cancel", run_id)
    crashed(js)
    case.restart()
    # The user cancels again (a no-op when the first cancel already stopped it).
    client(js).cancel(run_id)
    runs = check_invariants(case, expect={run_id: "CANCELED"})
    assert runs[run_id]["reason"] == "Canceled"


def test_hold_survives_a_crash(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    configure(js, gpus=False, daemon_yaml=ONE_AT_A_TIME)
    case = Case(js, "hold.recorded", tmp_path / "execs")
    case.start_crashing()
    gate = tmp_path / "gate"
    first = case.submit(repo, "--name", "first", "--", job_command(case.execs, gate=gate))
    second = case.submit(repo, "--name", "second", "--env", "TOKEN=s3cret", "--", job_command(case.execs))
    assert first is not None and second is not None
    _wait_phase(js, first, "RUNNING")
    _in_background(js, "hold", second)
    crashed(js)
    case.restart()
    waiting = client(js).queue()["waiting"]
    assert [(w["id"], w["held"]) for w in waiting] == [(second, True)]
    gate.touch()
    wait_all(js, [first])
    time.sleep(0.5)  # a held run does not start when the slot frees
    assert client(js).show(second)["run"]["phase"] == "QUEUED"
    client(js).release(second)
    check_invariants(case)


def test_release_survives_a_crash(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    configure(js, gpus=False)
    case = Case(js, "release.recorded", tmp_path / "execs")
    case.start_crashing()
    held = [case.submit(repo, "--name", f"h{i}", "--hold", "--", job_command(case.execs)) for i in range(3)]
    assert None not in held
    _in_background(js, "release", *[h for h in held if h])
    crashed(js)
    case.restart()
    # The user releases what is still held (the first release was recorded).
    still = [w["id"] for w in client(js).queue()["waiting"] if w["held"]]
    assert len(still) < 3
    for run_id in still:
        client(js).release(run_id)
    check_invariants(case)


@pytest.mark.parametrize("point", ["retention.archived", "retention.archive_deleted", "retention.run_dir_removed"])
def test_retention_survives_a_crash_at(js: JobsupEnv, repo: Path, tmp_path: Path, point: str) -> None:
    configure(js, gpus=False)
    case = Case(js, point, tmp_path / "execs")
    case.start_crashing()
    run_id = case.submit(repo, "--", job_command(case.execs))
    assert run_id is not None
    wait_all(js, [run_id])
    _in_background(js, "prune", "--older-than", "0s", "--delete-archives", "--run-dirs")
    crashed(js)
    case.restart()
    if point == "retention.archived":
        assert log_lines(js, run_id) == ["out"]  # read from its archive
    report = client(js).prune(older_than="0s", delete_archives=True, run_dirs=True)
    assert report["errors"] == [], report
    check_invariants(case, logs=False)
    assert not (js.state_dir / "runs" / run_id).exists()
    assert client(js).prune(older_than="0s", delete_archives=True, run_dirs=True)["errors"] == []
