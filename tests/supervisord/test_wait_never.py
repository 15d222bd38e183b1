"""`wait --for PHASE` on a run that ended without reaching PHASE says it
never will, with its own phase's exit code (a run that passed PHASE on the
way to its end still meets it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = [pytest.mark.timeout(120), pytest.mark.daemon]


def test_wait_for_running_on_a_run_canceled_while_queued(js: JobsupEnv, repo: Path) -> None:
    held = js.submit(repo, "--name", "never", "--hold", "--", "true")
    js.cli("cancel", held)
    r = js.cli("wait", held, "--for", "RUNNING", "--timeout", "30s", check=False)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "without being RUNNING: it never will be" in r.stderr, r.stderr
    ok = js.submit(repo, "--name", "ok", "--", "true")
    js.cli("wait", ok)
    assert js.cli("wait", ok, "--for", "RUNNING").returncode == 0  # it was RUNNING on the way


def test_hold_and_release_answer_the_state_after_the_change(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    first = js.submit(repo, "--name", "first", "--", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    second = js.submit(repo, "--name", "second", "--after", first, "--", "true")
    r = js.cli("hold", second)
    assert r.stderr.strip() == f"run {second}: QUEUED (Held)", r.stderr
    r = js.cli("release", second)
    assert r.stderr.strip() == f"run {second}: QUEUED (WaitingForDependency)", r.stderr
    gate.touch()
    js.cli("wait", second, "--timeout", "60s")


def test_logs_follow_of_a_queued_run_says_why_it_waits_and_follows(js: JobsupEnv, repo: Path) -> None:
    held = js.submit(repo, "--name", "later", "--hold", "--", "echo hello")
    proc = js.popen("logs", held, "-f")
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("waiting to start: Held"), first
    js.cli("release", held)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "hello\n", (out, err)
