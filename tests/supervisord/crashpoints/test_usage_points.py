"""A daemon killed right after its memory watchdog stopped a run (the mark
recorded, the runner signalled, the run's end not recorded): after a
restart the run still ends ERROR OOMKilled with its peak and limit, not
CANCELED by the runner's SIGTERM (see harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.supervisord.crashpoints.harness import Case, client, configure, crashed, wait_all
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HOG = "import time\nblock = bytearray(150 << 20)\nfor i in range(0, len(block), 4096): block[i] = 1\ntime.sleep(60)\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"hog.py": HOG})


def test_a_run_stopped_for_its_memory_ends_oomkilled_across_a_crash(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    configure(js, gpus=False, daemon_yaml="local:\n  usage_interval_s: 0.5\n")
    case = Case(js, "usage.over_limit_stopping", tmp_path / "execs")
    case.start_crashing()
    run_id = case.submit(repo, "--name", "hog", "--memory", "64M", "--", f"{sys.executable} hog.py")
    assert run_id is not None
    crashed(js)
    case.restart()
    run = wait_all(js, [run_id])[run_id]
    assert (run["phase"], run["reason"]) == ("ERROR", "OOMKilled"), run
    assert "over its --memory limit of 64M" in run["message"], run
    marks = [e for e in client(js).events(run=run_id) if e.get("type") == "ResourceUsage" and "over_limit" in e["data"]]
    assert marks and marks[0]["data"]["over_limit"] == run["message"], marks
    # The runner itself saw a SIGTERM (what a cancel looks like to it): the daemon's mark decided.
    assert js.runner_status(run_id)["reason"] == "Canceled"
