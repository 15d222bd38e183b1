"""Storage trouble never decides a run's outcome: a write lock held by a
second process, a full disk (a small tmpfs). Real daemon, real CLI, real
processes and SQLite files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env

pytestmark = [pytest.mark.timeout(300), pytest.mark.daemon]

_HOLD_LOCK = (
    "import sqlite3, sys\n"
    "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "conn.execute('BEGIN IMMEDIATE')\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
    "conn.execute('ROLLBACK')\n"
)


def _daemon_log_events(js: JobsupEnv) -> list[dict[str, object]]:
    out = []
    for line in js.daemon_log.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def test_a_locked_database_never_ends_a_run(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    """A second process holds the write lock for longer than the
    busy timeout (5 s) while a run writes output and ends: the run stays
    RUNNING, its lines wait and are all recorded, the daemon log warns, and
    the outcome is the process's own."""
    go, done = tmp_path / "go", tmp_path / "done"
    run_id = js.submit(
        repo,
        "--",
        f"while [ ! -e {go} ]; do sleep 0.05; done; for i in $(seq 1 60); do echo line-$i; sleep 0.02; done; "
        f"touch {done}",
    )
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "60s", check=False).returncode == 0
    db = js.state_dir / "jobsup.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        go.touch()  # the job writes its lines and exits while the lock is held
        deadline = time.monotonic() + 120
        while not done.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(11)  # past two busy timeouts
        # Reads still work while writes wait; the run is not ended by the lock.
        run = json.loads(js.cli("runs", "-o", "json").stdout)[0]
        assert run["id"] == run_id and run["phase"] == "RUNNING", run
        health = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
        store_check = next(c for c in health if c["name"] == "store")
        assert store_check["ok"] is False and "locked" in store_check["detail"], store_check
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "60s", check=False)
    assert w.returncode == 0, (w.stdout, w.stderr)
    run = json.loads(w.stdout)[0]
    assert run["phase"] == "COMPLETED" and run["exit_code"] == 0, run
    assert js.cli("logs", run_id).stdout.splitlines() == [f"line-{i}" for i in range(1, 61)]
    events = _daemon_log_events(js)
    blocked = [e for e in events if e.get("event") == "store.write_blocked"]
    assert blocked and blocked[0]["problem"] == "locked", blocked
    assert any(e.get("event") == "store.write_resumed" for e in events)
    checks = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
    assert next(c for c in checks if c["name"] == "store")["ok"] is True


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at ``path`` (root only), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last block; the filler file."""
    filler = folder / "filler"
    chunk = b"\0" * (1 << 16)
    with filler.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                break
        small = b"\0" * 512
        while True:
            try:
                f.write(small)
            except OSError:
                break
    return filler


@pytest.fixture
def full_js(tmp_path: Path) -> Iterator[JobsupEnv]:
    with _tmpfs(tmp_path / "fs", "48m") as fs:
        with jobsup_env(tmp_path) as env:
            env.env["JOBSUP_STATE_DIR"] = str(fs / "state")
            env.daemon_log = fs / "daemon-test.log"  # the daemon's log fills up with the rest
            yield env


def test_a_full_disk_keeps_the_daemon_up_and_ingests_everything_once_space_returns(
    full_js: JobsupEnv, repo: Path, tmp_path: Path
) -> None:
    """The state dir's disk fills while a run's output waits
    to be ingested and while the run ends. The daemon stays up and serves
    reads, `runs` and `doctor` say "disk full", the run stays supervised (not
    Lost, not ERROR), and once space returns every line is ingested and the
    run ends with its process's outcome."""
    js = full_js
    js.start_daemon()
    go, written = tmp_path / "go", tmp_path / "written"
    n = 40000
    run_id = js.submit(
        repo,
        "--",
        f"while [ ! -e {go} ]; do sleep 0.05; done; seq -f 'line-%.0f' 1 {n}; touch {written}; "
        f"while [ -e {go} ]; do sleep 0.05; done; echo last",
    )
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    db = js.state_dir / "jobsup.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    filler: Path | None = None
    try:
        # Hold ingestion back with the lock while the job writes, then fill the disk.
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        go.touch()
        deadline = time.monotonic() + 60
        while not written.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        filler = _fill(js.state_dir.parent)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert filler is not None
    try:
        go.unlink()  # the job prints its last line (which the full disk refuses) and exits 0
        time.sleep(8)
        r = js.cli("runs", "-o", "json", check=False)
        assert r.returncode == 0, r.stderr
        run = json.loads(r.stdout)[0]
        assert run["id"] == run_id and run["phase"] == "RUNNING", run
        assert "disk full" in r.stderr, r.stderr
        checks = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
        store_check = next(c for c in checks if c["name"] == "store")
        assert store_check["ok"] is False and "disk full" in store_check["detail"], store_check
        assert js.daemon is not None and js.daemon.poll() is None
    finally:
        filler.unlink()  # space returns
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "90s", check=False)
    assert w.returncode == 0, (w.stdout, w.stderr)
    run = json.loads(w.stdout)[0]
    assert run["phase"] == "COMPLETED" and run["exit_code"] == 0, run
    out = js.cli("logs", run_id).stdout.splitlines()
    assert out[:n] == [f"line-{i}" for i in range(1, n + 1)]
    checks = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
    assert next(c for c in checks if c["name"] == "store")["ok"] is True


def test_a_daemon_that_cannot_start_on_a_full_disk_says_why_and_exits(tmp_path: Path) -> None:
    """The CLI autostarts a daemon whose state dir is on a full disk:
    the daemon exits (no hang, no traceback) and the CLI's error says the
    disk is full, although the daemon could not write its log there."""
    with _tmpfs(tmp_path / "fs", "2m") as fs:
        with jobsup_env(tmp_path) as env:
            env.env["JOBSUP_STATE_DIR"] = str(fs / "state")
            del env.env["JOBSUP_NO_AUTOSTART"]
            _fill(fs)
            r = env.cli("runs", check=False, timeout=90)
            assert r.returncode == 69, (r.stdout, r.stderr)
            assert "full" in r.stderr and "Traceback" not in r.stderr, r.stderr
            lock = fs / "state" / "daemon.lock"
            # the daemon is gone: its state-dir lock is free again
            import fcntl

            with lock.open("rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
