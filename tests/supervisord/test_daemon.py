"""The daemon process: socket safety, readiness, clean stop, peer credentials."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = pytest.mark.timeout(120)


def test_socket_modes_and_clean_sigterm(js: JobsupEnv) -> None:
    js.start_daemon()
    assert stat.S_IMODE(js.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(js.socket.parent.stat().st_mode) == 0o700
    assert js.stop_daemon() == 0
    assert not js.socket.exists()


def test_ready_notification(js: JobsupEnv) -> None:
    addr = str(js.sock_dir / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(addr)
        s.settimeout(30)
        js.start_daemon(extra_env={"NOTIFY_SOCKET": addr}, wait=False)
        msg = s.recv(4096).decode()
        assert msg == "READY=1"
        # Ready means the API answers.
        js.cli("runs")


def test_refuses_second_daemon(js: JobsupEnv) -> None:
    js.start_daemon()
    second = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=js.env, capture_output=True, text=True, timeout=60
    )
    assert second.returncode != 0
    # The state-dir lock is taken before the socket is looked at.
    assert "already uses the state dir" in second.stderr
    js.cli("runs")  # the first one is unharmed


def test_refuses_socket_folder_writable_by_others(js: JobsupEnv) -> None:
    os.chmod(js.sock_dir, 0o777)
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=js.env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "writable by other users" in r.stderr


def test_stale_socket_is_replaced(js: JobsupEnv) -> None:
    js.start_daemon()
    js.kill_daemon(signal.SIGKILL)
    assert js.socket.exists()
    js.start_daemon()
    js.cli("runs")


def test_connection_from_another_uid_is_dropped(js: JobsupEnv) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    js.start_daemon()
    # Let another user reach the socket file, so only SO_PEERCRED stands in the way.
    os.chmod(js.sock_dir, 0o711)
    os.chmod(js.socket, 0o666)
    code = (
        "import os, socket, sys\n"
        "os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(10)\n"
        f"s.connect({str(js.socket)!r})\n"
        "try:\n"
        "    s.sendall(b'GET /v1/health HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "    data = s.recv(100)\n"
        "except (ConnectionResetError, BrokenPipeError):\n"
        "    data = b''\n"
        "sys.exit(0 if data == b'' else 1)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"peer of another uid got an answer: {r.stdout} {r.stderr}"
    os.chmod(js.sock_dir, 0o700)
    js.cli("runs")  # our own uid still gets answers


def test_cli_autostarts_a_daemon(js: JobsupEnv) -> None:
    env = {**js.env}
    env.pop("JOBSUP_NO_AUTOSTART")
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "runs", "-o", "json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "started jobsup daemon" in r.stderr
    assert (js.state_dir / "daemon.log").exists()
    # Stop the autostarted daemon.
    import httpx

    with httpx.Client(transport=httpx.HTTPTransport(uds=str(js.socket))) as c:
        pid = c.get("http://x/v1/health").json()["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while js.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not js.socket.exists()


def test_a_failed_autostart_shows_what_that_daemon_wrote_not_older_lines(js: JobsupEnv) -> None:
    js.state_dir.mkdir(parents=True, exist_ok=True)
    (js.state_dir / "daemon.log").write_text('{"event": "an old line from an earlier daemon"}\n' * 40)
    js.daemon_config("retention: {archive_logs_after: soon}\n")  # the daemon refuses to start: exit 2
    env = {k: v for k, v in js.env.items() if k != "JOBSUP_NO_AUTOSTART"}
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "runs"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0
    assert "failed to start (exit 2)" in r.stderr, r.stderr
    assert "archive_logs_after" in r.stderr, r.stderr  # the daemon's own error line
    assert "an old line" not in r.stderr, r.stderr


def test_no_daemon_and_no_autostart_exits_69(js: JobsupEnv) -> None:
    r = js.cli("wait", "abcd", check=False)
    assert r.returncode == 69
    assert "JOBSUP_NO_AUTOSTART" in r.stderr


def test_one_daemon_per_state_dir_whatever_the_socket(js: JobsupEnv) -> None:
    js.start_daemon()
    other = {**js.env, "JOBSUP_SOCKET": str(js.sock_dir / "other.sock")}
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=other, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "already uses the state dir" in r.stderr
    assert not (js.sock_dir / "other.sock").exists()
    js.cli("runs")


def test_state_files_are_private(js: JobsupEnv) -> None:
    js.start_daemon()
    db = js.state_dir / "jobsup.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(js.state_dir.stat().st_mode) == 0o700


def test_refuses_a_socket_another_daemon_answers(js: JobsupEnv, tmp_path: Path) -> None:
    js.start_daemon()
    other_state = {**js.env, "JOBSUP_STATE_DIR": str(tmp_path / "other-state")}
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=other_state, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "already answers" in r.stderr


def test_bad_daemon_config_fails_fast_with_every_error(js: JobsupEnv, tmp_path: Path) -> None:
    cfg = tmp_path / "daemon.yaml"
    cfg.write_text(
        "kubernetes:\n"
        "  pod_ready_timeout_s: 0\n"
        "  runtime_class: Not_A_DNS_Name\n"
        "  tolerations:\n"
        "    - {key: gpu, operator: Exists, value: 'yes'}\n"
        "  pvc_mounts:\n"
        "    - {claim_name: data, mount_path: /dev/shm/}\n"
    )
    env = {**js.env, "JOBSUP_DAEMON_CONFIG": str(cfg)}
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0
    for needle in ("pod_ready_timeout_s", "runtime_class", "tolerations", "mount_path"):
        assert needle in r.stderr, (needle, r.stderr)
    assert not js.socket.exists()


def test_bad_timeout_variable_fails_fast(js: JobsupEnv) -> None:
    env = {**js.env, "JOBSUP_K8S_POD_READY_TIMEOUT_S": "abc"}
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "JOBSUP_K8S_POD_READY_TIMEOUT_S" in r.stderr
    assert not js.socket.exists()


def test_sigterm_with_open_streams_ends_them_cleanly_and_logs_json(js: JobsupEnv, tmp_path: Path) -> None:
    """Stopping the daemon while ``logs -f``, ``events -f`` and ``wait``
    streams are open: its log stays one JSON object a line (no uvicorn
    plain text, no traceback, no error: a routine stop is not a failure),
    and each client reconnects to the next daemon and ends as it would
    have (no line lost)."""
    import json

    from tests.supervisord.jobsup_env import make_repo

    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    run = js.submit(repo, "--", "echo first; sleep 600")
    deadline = time.monotonic() + 60
    while js.show(run)["log_lines"] < 1:
        assert time.monotonic() < deadline, js.show(run)
        time.sleep(0.1)
    clients = {
        name: subprocess.Popen(
            [sys.executable, "-m", "supervisord", *args],
            env=js.env,
            cwd=js.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in {"logs": ["logs", "-f", run], "events": ["events", "-f", run], "wait": ["wait", run]}.items()
    }
    try:
        logs_out = clients["logs"].stdout
        events_out = clients["events"].stdout
        assert logs_out is not None and events_out is not None
        assert logs_out.readline() == "first\n"
        assert json.dumps(run) and events_out.readline()  # the stream is open
        before = js.daemon_log.read_text()
        assert js.stop_daemon() == 0
        after = js.daemon_log.read_text()[len(before) :]
        assert after, "the daemon logged nothing while stopping"
        for line in after.splitlines():
            doc = json.loads(line)  # raises on plain text
            assert doc.get("level") not in ("error", "critical") and "exception" not in doc, line
        time.sleep(1)
        assert all(p.poll() is None for p in clients.values()), {n: p.poll() for n, p in clients.items()}
        js.start_daemon()
        js.cli("cancel", run)
        out = {name: clients[name].communicate(timeout=60) for name in ("logs", "wait")}
        time.sleep(1)  # events -f follows until stopped: let it print the cancel first
        clients["events"].terminate()
        out["events"] = clients["events"].communicate(timeout=60)
    finally:
        for p in clients.values():
            p.kill()
    assert clients["logs"].returncode == 0 and out["logs"][0] == "", out["logs"]
    assert "lost the jobsup daemon" in out["logs"][1] and f"run {run}: CANCELED" in out["logs"][1]
    assert clients["wait"].returncode == 3, out["wait"]
    events = [line.split()[4] for line in out["events"][0].splitlines()]
    assert "PhaseChanged" in events and "CancelRequested" in events, out["events"]


def test_library_log_records_are_json_lines_off_a_tty() -> None:
    """What libraries log through the standard library (uvicorn's errors,
    with a traceback) is a JSON line in the daemon log like jobsup's own:
    the traceback in its ``exception`` field, not plain text."""
    import json

    code = (
        "import logging\n"
        "from supervisord.shared.logging import configure_logging\n"
        "configure_logging('info')\n"
        "try:\n"
        "    raise ValueError('boom')\n"
        "except ValueError:\n"
        "    logging.getLogger('uvicorn.error').exception('Exception in ASGI application')\n"
        "logging.getLogger('some.lib').info('not shown: libraries log warnings and up')\n"
        "logging.getLogger('some.lib').warning('careful %s', 'now')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert len(lines) == 2, proc.stderr
    first, second = lines
    assert first["logger"] == "uvicorn.error" and first["level"] == "error"
    assert first["event"] == "Exception in ASGI application" and "ValueError: boom" in first["exception"]
    assert second == {**second, "logger": "some.lib", "level": "warning", "event": "careful now"}
    assert "timestamp" in first and "timestamp" in second


def _cancel_during_stop(js: JobsupEnv, tmp_path: Path, job: str, *args: str) -> tuple[str, float, str, str, int]:
    """Submit ``job``, start ``jobsup cancel`` on it, stop the daemon while
    the cancel waits for the job to end. Returns (run id, seconds the stop
    took, the cancel's stdout, its stderr, its exit code)."""
    from tests.supervisord.jobsup_env import make_repo

    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    run = js.submit(repo, *args, "--", job)
    deadline = time.monotonic() + 60
    while js.show(run)["log_lines"] < 1:
        assert time.monotonic() < deadline, js.show(run)
        time.sleep(0.1)
    cancel = js.popen("cancel", run)
    try:
        # The cancel is in flight once its CancelRequested is recorded (the
        # job ignores or delays SIGTERM, so the request waits for it).
        while "CancelRequested" not in js.cli("events", run).stdout:
            assert time.monotonic() < deadline and cancel.poll() is None, cancel.poll()
            time.sleep(0.1)
        started = time.monotonic()
        assert js.stop_daemon() == 0
        took = time.monotonic() - started
        out, err = cancel.communicate(timeout=60)
    finally:
        cancel.kill()
    return run, took, out, err, cancel.returncode


def test_a_request_in_flight_at_stop_gets_its_answer_within_the_grace(js: JobsupEnv, tmp_path: Path) -> None:
    """A stop lets the requests being handled finish (up to STOP_GRACE_S):
    a cancel waiting 4 s for its job to end gets its answer, CANCELED,
    instead of an HTTP 500 after uvicorn's 2 s (a tester's finding)."""
    job = "trap 'sleep 4; exit 0' TERM; echo ready; while :; do sleep 0.2; done"
    run, took, out, err, code = _cancel_during_stop(js, tmp_path, job)
    assert code == 0, (out, err)
    assert "CANCELED" in out + err and "HTTP 500" not in err, (out, err)
    assert took >= 2, took  # it did wait for the request
    log = js.daemon_log.read_text()
    assert "Exception in ASGI application" not in log and "requests_cancelled" not in log


def test_a_request_past_the_stop_grace_is_answered_daemon_stopping(js: JobsupEnv, tmp_path: Path) -> None:
    """A request still running when the stop's grace ends is answered 503
    DaemonStoppingError (a DaemonUnreachableError to clients: exit 69, a
    message saying what to check), never uvicorn's plain 500 and traceback;
    the run is still supervised by the next daemon."""
    from supervisord.daemon.backends.local.backend import run_processes
    from supervisord.daemon.service import STOP_GRACE_S

    job = "trap '' TERM; echo ready; while :; do sleep 0.2; done"
    run, took, out, err, code = _cancel_during_stop(js, tmp_path, job, "--config", "local.kill_grace_s=120")
    try:
        assert code == 69, (code, out, err)
        assert err.startswith("error: the daemon stopped before it finished this request (POST /v1/cancel)"), err
        assert "HTTP 500" not in err and "Internal Server Error" not in err
        assert took >= STOP_GRACE_S - 1, took
        log = js.daemon_log.read_text()
        assert "Exception in ASGI application" not in log and "requests_cancelled" in log
        js.start_daemon()
        assert js.show(run)["phase"] == "RUNNING"  # still supervised, still being stopped by its runner
    finally:
        for pid in run_processes(run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert js.cli("wait", run, "--timeout", "60s", check=False).returncode in (1, 3)


def test_a_slow_snapshot_does_not_hold_up_a_stop(js: JobsupEnv, tmp_path: Path) -> None:
    """A submit whose ``git archive`` is slow (a git filter, as LFS is) when
    the daemon stops: past the grace its git child is killed (not waited
    for in a thread), the client gets DaemonStoppingError and learns from
    the next daemon that nothing was recorded; no temp archive is left (a
    tester's finding: the stop waited for git, and the client got HTTP 500)."""
    from supervisord.daemon.service import STOP_GRACE_S
    from tests.supervisord.jobsup_env import live_pids_with_arg, make_repo

    repo = make_repo(tmp_path / "repo", {"run.sh": "echo hi\n", ".gitattributes": "run.sh filter=slow\n"})
    subprocess.run(["git", "-C", str(repo), "config", "filter.slow.smudge", "sleep 47; cat"], check=True)
    js.start_daemon()
    submit = js.popen("submit", "--", "bash run.sh", cwd=repo)
    try:
        deadline = time.monotonic() + 60
        while not live_pids_with_arg("sleep\x0047"):  # the daemon's git archive runs the filter
            assert time.monotonic() < deadline and submit.poll() is None, submit.poll()
            time.sleep(0.1)
        started = time.monotonic()
        assert js.stop_daemon() == 0  # within 30 s: the filter alone sleeps 47
        took = time.monotonic() - started
        js.start_daemon()
        out, err = submit.communicate(timeout=90)
        # git's filter went with it (the whole process group is killed).
        deadline = time.monotonic() + 10
        while live_pids_with_arg("sleep\x0047"):
            assert time.monotonic() < deadline, "the git filter outlived the daemon's stop"
            time.sleep(0.1)
    finally:
        submit.kill()
        for pid in live_pids_with_arg("sleep\x0047"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert STOP_GRACE_S - 1 <= took < STOP_GRACE_S + 10, took
    assert submit.returncode == 69, (out, err)
    assert "the daemon stopped before it finished this request (POST /v1/runs)" in err, err
    assert "the run was NOT recorded" in err and "HTTP 500" not in err, err
    assert json.loads(js.cli("runs", "-o", "json").stdout) == []
    assert not list((js.state_dir / "snapshots").glob(".archive-*"))
    log = js.daemon_log.read_text()
    assert "Exception in ASGI application" not in log and "requests_cancelled" in log


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_replay_during_a_stop_is_whole_or_an_error(js: JobsupEnv, tmp_path: Path, output: str) -> None:
    """A stop during ``jobsup logs RUN`` (no ``-f``) with a reader that
    keeps reading, a little slowly: the replay gets the stop's grace and
    ends whole (it used to be ended like a followed stream, whose client
    resumes, so the command exited 0 with part of the log: a tester's
    finding); one cut off after the grace is an error."""
    import threading

    from tests.supervisord.jobsup_env import make_repo

    n = 1_500_000
    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"many.py": f"for i in range({n}):\n    print(f'line-{{i}}')\n"})
    run = js.submit(repo, "--", "python3 many.py")
    js.cli("wait", run, "--timeout", "120s")
    reader = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "logs", run, "-o", output],
        env=js.env,
        cwd=js.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    got: list[bytes] = []
    started = threading.Event()

    def read() -> None:
        assert reader.stdout is not None
        while chunk := reader.stdout.read1(65536):
            got.append(chunk)
            started.set()
            time.sleep(0.01)  # about 6 MB/s: the replay outlasts the start of the stop

    thread = threading.Thread(target=read)
    thread.start()
    try:
        assert started.wait(60)
        assert js.stop_daemon() == 0
        thread.join(60)
        err = reader.communicate(timeout=60)[1]
    finally:
        reader.kill()
        thread.join(5)
    lines = b"".join(got).count(b"\n")
    assert (reader.returncode, lines) == (0, n) or reader.returncode != 0, (reader.returncode, lines, err[-300:])
    if output == "text":  # one response: it ends well within the grace here
        assert lines == n, (lines, err[-300:])
