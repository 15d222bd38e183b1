"""A daemon killed at each durable step of a retry (supervisord.shared.retry):
after ``AttemptEnded`` (the backoff begins) and after ``AttemptStarted``
(the attempt's start not begun). After a restart the run goes on with its
policy: the second attempt runs exactly once (never twice, never lost), with
the env values kept for it, and the run ends COMPLETED with two attempts,
each line recorded once and no pending file left."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.supervisord.crashpoints.harness import (
    Case,
    Execs,
    client,
    configure,
    crashed,
    log_lines,
    run_ids,
    wait_all,
)
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RETRY_POINTS = ("retry.attempt_ended", "retry.attempt_started")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})


def _job(execs: Path) -> str:
    """Notes each execution in ``execs``; the first exits 9, the next ones 0."""
    return (
        f'n=$(grep -c "^start $JOBSUP_RUN_ID " {execs} 2>/dev/null); '
        f'echo "start $JOBSUP_RUN_ID $(date +%s.%N) none" >> {execs}; echo "out $TOKEN"; '
        f'echo "end $JOBSUP_RUN_ID $(date +%s.%N)" >> {execs}; [ "${{n:-0}}" -ge 1 ] || exit 9'
    )


@pytest.mark.parametrize("point", RETRY_POINTS)
def test_a_retry_survives_a_crash_at(js: JobsupEnv, repo: Path, tmp_path: Path, point: str) -> None:
    configure(js, gpus=False)
    case = Case(js, point, tmp_path / "execs")
    (repo / "task.yaml").write_text(f"run: {_job(case.execs)!r}\nretry: {{attempts: 2, on: ['exit:9'], backoff: 0s}}\n")
    case.start_crashing()
    run_id = case.submit(repo, "task.yaml", "--env", "TOKEN=s3cret")
    assert run_id is not None
    crashed(js)
    case.restart()
    assert run_ids(js) == [run_id]
    run = wait_all(js, [run_id])[run_id]
    assert (run["phase"], run["reason"], run["attempt"]) == ("COMPLETED", None, 2), (point, run)
    starts = Execs.read(case.execs).runs[run_id]
    assert len(starts) == 2, f"{point}: {len(starts)} executions"
    # The second attempt got the env value kept for it; each line once.
    assert log_lines(js, run_id) == ["out s3cret", "out s3cret"]
    doc = client(js).show(run_id)
    assert [(a["attempt"], a["exit_code"]) for a in doc["attempts"]] == [(1, 9), (2, 0)]
    events = [e["type"] for e in client(js).events(run=run_id) if "type" in e]
    assert events.count("AttemptEnded") == 1 and events.count("AttemptStarted") == 1
    assert sorted((js.state_dir / "runs").glob("*/pending.json")) == []
