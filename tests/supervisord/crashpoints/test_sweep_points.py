"""A daemon killed at each durable step of a sweep submit. After a restart
either the whole sweep exists (its SweepSubmitted and every run's
Submitted) and each of its runs executes once, or nothing of it does: no
event, no run, no pending file, no folder (see harness.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.supervisord.crashpoints.harness import Case, check_invariants, client, configure, crashed, job_command
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: Runs of the sweep: enough that a half-recorded sweep would show.
GRID = "i=1..4"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})


def _submit_sweep(case: Case, repo: Path) -> None:
    """``submit --sweep`` (the daemon dies while it answers); the sweep id
    goes into ``case.submitted`` when the CLI printed one."""
    cmd = job_command(case.execs, key="$JOBSUP_RUN_ID") + " # {i}"
    r = case.js.cli(
        "submit", "--name", "sw", "--sweep", GRID, "--env", "TOKEN=s3cret", "--", cmd, cwd=repo, check=False
    )
    if r.returncode == 0:
        case.submitted.append(r.stdout.strip())


def _events(js: JobsupEnv) -> list[dict[str, object]]:
    return [e for e in client(js).events(after=0) if "seq" in e]


@pytest.mark.parametrize("point", ["sweep.pending_written", "sweep.recorded"])
def test_sweep_submit_survives_a_crash_at(js: JobsupEnv, repo: Path, tmp_path: Path, point: str) -> None:
    configure(js, gpus=False)
    case = Case(js, point, tmp_path / "execs")
    case.start_crashing()
    thread = threading.Thread(target=_submit_sweep, args=(case, repo), daemon=True)
    thread.start()
    crashed(js)
    thread.join(timeout=60)
    assert case.submitted == [], "the CLI printed a sweep id although the daemon died before answering"
    case.restart()
    events = _events(js)
    sweeps = [e for e in events if e["type"] == "SweepSubmitted"]
    submitted = [e for e in events if e["type"] == "Submitted"]
    if point == "sweep.pending_written":
        # Nothing of it: no event, no run, and its pending file (env values) is gone.
        assert (sweeps, submitted) == ([], [])
        assert [p for p in (js.state_dir / "runs").glob("*") if p.name.startswith("s")] == []
        check_invariants(case)
        assert client(js).runs(all=True) == []
        return
    # All of it: one SweepSubmitted and one Submitted per grid point, and
    # every run executes exactly once after the restart.
    assert len(sweeps) == 1
    sweep_id = sweeps[0]["run_id"]
    assert sorted(json.dumps(e["data"]["params"]) for e in submitted) == sorted(
        json.dumps({"i": str(i)}) for i in range(1, 5)
    )
    assert {e["data"]["sweep_id"] for e in submitted} == {sweep_id}
    runs = check_invariants(case)
    assert len(runs) == 4
    assert not (js.state_dir / "runs" / str(sweep_id) / "pending.json").exists()
