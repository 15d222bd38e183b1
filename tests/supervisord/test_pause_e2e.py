"""`jobsup pause` / `jobsup resume` end to end: the real daemon, CLI and
local runner. The job's processes stop (SIGSTOP to the group) while the
runner goes on; the run stays RUNNING with reason Paused; paused time does
not count toward the timeout; refused for runs that are not RUNNING."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = [pytest.mark.timeout(300), pytest.mark.daemon]

# Appends a line each 0.1 s while not stopped.
TICK = "while true; do date +%s.%N >> {out}; sleep 0.1; done"


def _until(pred: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _types(js: JobsupEnv, run_id: str) -> list[str]:
    return [json.loads(l)["type"] for l in js.cli("events", run_id, "-o", "json").stdout.splitlines()]


def test_pause_stops_the_job_and_resume_lets_it_go_on(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "ticks"
    rid = js.submit(repo, "--name", "tick", "--", TICK.format(out=out))
    _until(lambda: _lines(out) >= 3)
    p = js.cli("pause", rid)
    assert f"run {rid}: RUNNING (Paused)" in p.stderr, p.stderr
    show = js.show(rid)
    assert (show["phase"], show["reason"]) == ("RUNNING", "Paused")
    n = _lines(out)
    time.sleep(1.0)
    assert _lines(out) <= n + 1  # a tick in flight at the stop may land; then nothing
    # Pausing again is a no-op; the runner keeps answering.
    js.cli("pause", rid)
    r = js.cli("resume", rid)
    assert f"run {rid}: RUNNING" in r.stderr and "Paused" not in r.stderr, r.stderr
    n = _lines(out)
    _until(lambda: _lines(out) >= n + 3)
    types = _types(js, rid)
    assert types.count("Paused") == 1 and types.count("Resumed") == 1, types
    resumed = next(json.loads(l) for l in js.cli("events", rid, "-o", "json").stdout.splitlines() if '"Resumed"' in l)
    assert resumed["data"]["paused_s"] >= 1.0
    js.cli("cancel", rid)


def test_paused_time_does_not_count_toward_the_timeout(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    rid = js.submit(
        repo, "--name", "slow", "--timeout", "4s", "--", "for i in $(seq 30); do sleep 0.1; done; echo done"
    )
    _until(lambda: js.show(rid)["phase"] == "RUNNING")
    js.cli("pause", rid)
    time.sleep(3.0)
    assert js.show(rid)["phase"] == "RUNNING"  # 4s passed since the start, paused for 3 of them
    js.cli("resume", rid)
    w = js.cli("wait", rid, "--timeout", "120s", check=False)
    assert w.returncode == 0, js.show(rid)


def test_cancel_of_a_paused_run_ends_it(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    rid = js.submit(repo, "--name", "pc", "--", "trap 'echo term; exit 7' TERM; while true; do sleep 0.1; done")
    _until(lambda: js.show(rid)["phase"] == "RUNNING")
    js.cli("pause", rid)
    js.cli("cancel", rid)
    assert js.show(rid)["phase"] == "CANCELED"


def test_pause_is_refused_for_a_run_that_is_not_running(js: JobsupEnv, repo: Path) -> None:
    rid = js.submit(repo, "--name", "held", "--hold", "--", "true")
    r = js.cli("pause", rid, check=False)
    assert r.returncode == 2 and r.stderr.strip() == f"error: run {rid} is QUEUED: only a RUNNING run can be paused"
    r = js.cli("resume", rid, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "Paused" not in _types(js, rid)
    js.cli("cancel", rid)
