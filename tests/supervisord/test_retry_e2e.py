"""Retries of local runs end to end (supervisord.shared.retry): a real daemon and
CLI. A run whose runner is killed with ``kill -9`` is retried (``--retry
1``) and ends COMPLETED with two attempts; each attempt's lines show once
and ``logs --attempt N`` picks one; a cancel during the backoff ends the run
at once; a failure the policy does not name is final; bad policies are
refused with nothing recorded."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(180), pytest.mark.daemon, pytest.mark.slow]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})


def _first_then(mark: Path, first: str, then: str) -> str:
    """A job that runs ``first`` at its first attempt (noted by ``mark``,
    outside the snapshot) and ``then`` at every later one."""
    return f"if [ -e {mark} ]; then {then}; else touch {mark}; {first}; fi"


def _wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _events(js: JobsupEnv, run_id: str) -> list[dict[str, Any]]:
    out = js.cli("events", run_id, "-o", "json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_a_runner_killed_with_kill_9_is_retried_and_completes(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    mark = tmp_path / "tried"
    cmd = _first_then(mark, "echo first; sleep 300", "echo second")
    run_id = js.submit(repo, "--retry", "1", "--config", "retry.backoff=0s", "--env", "TOKEN=s3cret", "--", cmd)
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    _wait_for("the first line", lambda: js.show(run_id)["log_lines"] >= 1)
    status = js.runner_status(run_id)
    os.kill(status["runner_pid"], signal.SIGKILL)  # the runner dies: the run is Lost, which --retry retries
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "60s", check=False)
    assert w.returncode == 0, (w.stdout, w.stderr)
    run = json.loads(w.stdout)[0]
    assert (run["phase"], run["reason"], run["attempt"]) == ("COMPLETED", None, 2)
    doc = js.show(run_id)
    assert [(a["attempt"], a["reason"]) for a in doc["attempts"]] == [(1, "Lost"), (2, None)]
    assert doc["retry"] == {
        "attempts": 1,
        "on": ["Lost", "Evicted", "Preempted", "NodeFailure", "OOMKilled"],
        "backoff_s": 0.0,
    }
    # Each attempt's lines, each once; and one attempt's alone.
    assert js.cli("logs", run_id).stdout.splitlines() == ["first", "second"]
    assert js.cli("logs", run_id, "--attempt", "1").stdout.splitlines() == ["first"]
    assert js.cli("logs", run_id, "--attempt", "2").stdout.splitlines() == ["second"]
    lines = [json.loads(x) for x in js.cli("logs", run_id, "-o", "json").stdout.splitlines()]
    assert [(x["text"], x["attempt"]) for x in lines] == [("first", 1), ("second", 2)]
    bad = js.cli("logs", run_id, "--attempt", "3", check=False)
    assert bad.returncode == 2 and "--attempt 3" in bad.stderr
    # The audit trail: AttemptEnded, then AttemptStarted, the run RUNNING Retrying between them.
    types = [(e["type"], e["data"].get("reason")) for e in _events(js, run_id)]
    ended = types.index(("AttemptEnded", "Lost"))
    assert types[ended + 1] == ("PhaseChanged", "Retrying")
    assert [t for t, _ in types[ended:]].count("AttemptStarted") == 1
    assert [t for t, _ in types].count("HandleRecorded") >= 2
    table = js.cli("show", run_id).stdout
    assert "attempt:" in table and "Lost" in table
    # The env values were kept for the attempt and are gone now.
    assert not (js.state_dir / "runs" / run_id / "pending.json").exists()


def test_a_failure_the_policy_does_not_name_is_final(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--retry", "3", "--", "echo once; exit 3")
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "60s", check=False)
    run = json.loads(w.stdout)[0]
    assert (w.returncode, run["phase"], run["reason"], run["exit_code"], run["attempt"]) == (
        1,
        "ERROR",
        "NonZeroExit",
        3,
        1,
    )
    assert js.show(run_id).get("attempts", []) == []


def test_exit_codes_retry_until_the_attempts_run_out(js: JobsupEnv, repo: Path) -> None:
    (repo / "task.yaml").write_text("run: echo try; exit 75\nretry: {attempts: 2, on: ['exit:75'], backoff: 0s}\n")
    run_id = js.submit(repo, "task.yaml")
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "60s", check=False)
    run = json.loads(w.stdout)[0]
    # The final phase, reason and exit code are the last attempt's.
    assert (w.returncode, run["phase"], run["reason"], run["exit_code"], run["attempt"]) == (
        1,
        "ERROR",
        "NonZeroExit",
        75,
        3,
    )
    attempts = js.show(run_id)["attempts"]
    assert [(a["attempt"], a["exit_code"], a["first_line"], a["last_line"]) for a in attempts] == [
        (1, 75, 1, 1),
        (2, 75, 2, 2),
        (3, 75, 3, 3),
    ]
    assert js.cli("logs", run_id).stdout.splitlines() == ["try", "try", "try"]
    # rerun keeps the policy.
    again = js.cli("rerun", run_id, cwd=repo).stdout.split()[0]
    assert js.show(again)["retry"] == {"attempts": 2, "on": ["exit:75"], "backoff_s": 0.0}
    js.cli("wait", again, "--timeout", "60s", check=False)


def test_a_cancel_during_the_backoff_ends_the_run_at_once(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    (repo / "task.yaml").write_text("run: exit 9\nretry: {attempts: 5, on: ['exit:9'], backoff: 1h}\n")
    run_id = js.submit(repo, "task.yaml")
    _wait_for("the backoff", lambda: js.show(run_id)["reason"] == "Retrying")
    run = js.show(run_id)
    assert run["phase"] == "RUNNING" and "attempt 2 starts in 3600s" in run["message"]
    paused = js.cli("pause", run_id, check=False)
    assert paused.returncode == 2 and "between two attempts" in paused.stderr, paused.stderr
    started = time.monotonic()
    js.cli("cancel", run_id)
    assert time.monotonic() - started < 30
    run = js.show(run_id)
    assert (run["phase"], run["reason"], run["attempt"]) == ("CANCELED", "Canceled", 1)
    assert not (js.state_dir / "runs" / run_id / "pending.json").exists()


def test_a_restart_during_the_backoff_goes_on_with_the_next_attempt(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    mark = tmp_path / "tried"
    (repo / "task.yaml").write_text(
        f"run: {_first_then(mark, 'echo one; exit 9', 'echo two $TOKEN')}\n"
        "retry: {attempts: 1, on: ['exit:9'], backoff: 3s}\n"
    )
    run_id = js.submit(repo, "task.yaml", "--env", "TOKEN=kept")
    _wait_for("the backoff", lambda: js.show(run_id)["reason"] == "Retrying")
    js.kill_daemon(signal.SIGKILL)
    js.start_daemon()
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "60s", check=False)
    assert w.returncode == 0, w.stdout
    assert js.cli("logs", run_id).stdout.splitlines() == ["one", "two kept"]
    assert [e["type"] for e in _events(js, run_id)].count("AttemptStarted") == 1


@pytest.mark.parametrize(
    ("args", "task", "needle"),
    [
        (["--retry", "0"], None, "--retry"),
        (["--retry", "101"], None, "--retry"),
        (["--retry", "1", "--backend", "slurm"], None, "Slurm runs are not retried"),
        ([], "retry: {attempts: 0}", "retry`.attempts"),
        ([], "retry: {attempts: 2, on: [Bogus]}", "'Bogus' is not a failure reason"),
        ([], "retry: {attempts: 2, backoff: -5s}", "retry`.backoff"),
        ([], "retry: {attempts: 2, tries: 3}", "unknown key(s) tries"),
        ([], "retry: {attempts: 2, on: ['exit:0']}", "exit:0"),
    ],
)
def test_a_bad_policy_is_refused_and_nothing_recorded(
    js: JobsupEnv, repo: Path, args: list[str], task: str | None, needle: str
) -> None:
    if task is not None:
        (repo / "task.yaml").write_text(f"run: echo hi\n{task}\n")
        args = ["task.yaml", *args]
    else:
        args = [*args, "--", "echo hi"]
    r = js.cli("submit", *args, cwd=repo, check=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []
