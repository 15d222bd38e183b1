"""`jobsup daemon stop|restart|reload` end to end: the real daemon and CLI.
Stop and restart leave runs running; reload applies the daemon and user
config (queues, hooks) and records ConfigReloaded, or refuses an invalid
config with every error and changes nothing; `hooks` and `doctor` warn
when a config file changed since the daemon read it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = pytest.mark.timeout(300)


def _until(pred: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _daemon_events(js: JobsupEnv, etype: str) -> list[dict[str, Any]]:
    evs = [json.loads(l) for l in js.cli("events", "-o", "json").stdout.splitlines()]
    return [e for e in evs if e["type"] == etype]


def test_stop_and_restart_leave_runs_running(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    js.start_daemon()
    gate = tmp_path / "gate"
    rid = js.submit(repo, "--name", "long", "--", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    _until(lambda: js.show(rid)["phase"] == "RUNNING")
    out = js.cli("daemon", "stop")
    assert "stopped the jobsup daemon" in out.stdout and "1 run keeps running" in out.stdout, out
    assert js.daemon is not None and js.daemon.wait(timeout=30) == 0
    assert js.runner_status(rid)["state"] == "running"  # the run went on without a daemon
    # restart: a new daemon (autostarted, no systemd here) reattaches.
    js.start_daemon()
    old_pid = js.daemon.pid
    out = js.cli("daemon", "restart", extra_env={"JOBSUP_NO_AUTOSTART": "0"})
    assert "restarted the jobsup daemon" in out.stdout and "1 run keeps running" in out.stdout, out
    health_pid = json.loads(js.cli("doctor", "-o", "json").stdout)[0]["detail"].split()[1]
    assert int(health_pid) != old_pid
    assert js.show(rid)["phase"] == "RUNNING"
    gate.touch()
    js.cli("wait", rid, "--timeout", "120s")
    js.cli("daemon", "stop")  # the autostarted one


def test_reload_applies_queues_and_hooks_or_refuses_with_every_error(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    js.daemon_config("scheduler:\n  queues:\n    q: {max_parallel: 1}\n")
    js.start_daemon()
    assert js.cli("hooks").stderr.count("warning") == 0
    marker = tmp_path / "hook-ran"
    js.daemon_config("scheduler:\n  queues:\n    q: {max_parallel: 3}\n")
    js.user_config(
        "hooks:\n  - name: mark\n    when: [COMPLETED]\n"
        f'    command: [{sys.executable}, -c, \'open("{marker}", "a").write("x")\']\n'
    )
    warned = js.cli("hooks")
    assert "changed since the daemon read it" in warned.stderr and "daemon reload" in warned.stderr, warned.stderr
    doctor = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
    (config,) = [c for c in doctor if c["name"] == "config"]
    assert config["detail"].startswith("warning:"), config
    out = js.cli("daemon", "reload")
    assert "scheduler.queues" in out.stdout and "hooks added: mark" in out.stdout, out
    (ev,) = _daemon_events(js, "ConfigReloaded")
    assert ev["run_id"] == "daemon" and ev["data"]["hooks"]["added"] == ["mark"], ev
    queues = json.loads(js.cli("queue", "-o", "json").stdout)["queues"]
    assert [(q["max_parallel"], q["source"]) for q in queues if q["name"] == "q"] == [(3, "config")]
    assert "warning" not in js.cli("hooks").stderr
    assert [h["name"] for h in json.loads(js.cli("hooks", "-o", "json").stdout)] == ["mark", "on-done"]
    rid = js.submit(repo, "--name", "hooked", "--", "true")
    js.cli("wait", rid, "--timeout", "120s")
    _until(marker.exists)  # the new hook delivers
    # Invalid: every error, exit 2, nothing changed.
    js.daemon_config("scheduler:\n  queues:\n    q: {max_parallel: 0}\nnot_a_key: 1\n")
    bad = js.cli("daemon", "reload", check=False)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "max_parallel" in bad.stderr and "not_a_key" in bad.stderr, bad.stderr
    assert len(_daemon_events(js, "ConfigReloaded")) == 1
    queues = json.loads(js.cli("queue", "-o", "json").stdout)["queues"]
    assert [q["max_parallel"] for q in queues if q["name"] == "q"] == [3]


def test_jobsup_daemon_alone_still_runs_the_daemon(js: JobsupEnv) -> None:
    js.start_daemon()  # `python -m supervisord daemon`: the foreground daemon
    assert json.loads(js.cli("doctor", "-o", "json").stdout)[0]["ok"]
    assert "stop" in js.cli("daemon", "--help").stdout
