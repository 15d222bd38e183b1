"""W12: a daemon killed after it spawned a run's runner but before it
recorded the runner's handle. The next daemon must find that runner and
follow it, never start the run a second time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})


def _wait_daemon_dead(js: JobsupEnv, timeout: float = 60.0) -> int:
    assert js.daemon is not None
    return js.daemon.wait(timeout=timeout)


def test_runner_spawned_but_not_recorded_runs_once(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    execs = tmp_path / "execs"
    js.start_daemon(extra_env={"JOBSUP_TEST_CRASH_AT": "start.spawned"})
    # The job notes each execution outside its snapshot, then outlives the
    # restart, so a second execution would overlap the first.
    run_id = js.submit(repo, "--", f"echo $JOBSUP_RUN_ID >> {execs}; sleep 2; echo done; exit 3")
    assert _wait_daemon_dead(js) == -9
    js.start_daemon()
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "60s", check=False)
    assert w.returncode == 1, w.stdout + w.stderr
    run = json.loads(w.stdout)[0]
    # The runner's outcome, found through the runner the first daemon spawned.
    assert (run["phase"], run["exit_code"]) == ("ERROR", 3), run
    assert execs.read_text().splitlines() == [run_id]
    assert js.cli("logs", run_id).stdout.splitlines() == ["done"]
    handles = [
        e
        for e in map(json.loads, js.cli("events", run_id, "-o", "json").stdout.splitlines())
        if e["type"] == "HandleRecorded"
    ]
    assert len(handles) == 1 and isinstance(handles[0]["data"]["handle"]["runner_pid"], int)
