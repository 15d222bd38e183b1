"""Disk full while a run's output is ingested: the
database's disk fills while the job keeps printing. Appends fail with a
clear error in the daemon log, the job keeps running (its own files are on
another disk and are the buffer), and once space returns ingestion catches
up with nothing lost or doubled; the run's events then say what happened
(``StorageTrouble``)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo
from tests.supervisord.test_storage_trouble import _daemon_log_events, _fill, _tmpfs

pytestmark = pytest.mark.timeout(300)

HALF = 100_000


@pytest.fixture
def split_js(tmp_path: Path) -> Iterator[JobsupEnv]:
    """The state dir on a small tmpfs (the database fills it), its runs
    folder on another one with room (the job's output files)."""
    with _tmpfs(tmp_path / "fs", "40m") as fs:
        runs = fs / "state" / "runs"
        runs.mkdir(parents=True, mode=0o700)
        (fs / "state").chmod(0o700)
        with _tmpfs(runs, "200m"):
            with jobsup_env(tmp_path) as env:
                env.env["JOBSUP_STATE_DIR"] = str(fs / "state")
                yield env


def _wait_lines(js: JobsupEnv, run_id: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while js.show(run_id)["log_lines"] < n:
        assert time.monotonic() < deadline, js.show(run_id)
        time.sleep(0.1)


def test_disk_full_while_ingesting_loses_and_doubles_nothing(split_js: JobsupEnv, tmp_path: Path) -> None:
    js = split_js
    js.start_daemon()
    repo = make_repo(tmp_path / "proj", {"README": "x\n"})
    go, stop = tmp_path / "go", tmp_path / "stop"
    run_id = js.submit(
        repo,
        "--",
        f"seq -f 'line-%.0f' 1 {HALF}; while [ ! -e {go} ]; do sleep 0.05; done; "
        f"seq -f 'line-%.0f' {HALF + 1} {2 * HALF}; while [ ! -e {stop} ]; do sleep 0.05; done; echo last",
    )
    _wait_lines(js, run_id, HALF)
    filler = _fill(js.state_dir)
    try:
        go.touch()  # the job prints the second half while the database cannot grow
        deadline = time.monotonic() + 60
        while not any(e.get("event") == "store.write_blocked" for e in _daemon_log_events(js)):
            assert time.monotonic() < deadline, js.daemon_log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)
        blocked = [e for e in _daemon_log_events(js) if e.get("event") == "store.write_blocked"]
        assert blocked[0]["problem"] == "disk full" and "cannot grow" in str(blocked[0]["error"]), blocked[0]
        assert js.daemon is not None and js.daemon.poll() is None
        run = js.show(run_id)
        assert run["phase"] == "RUNNING" and run["log_lines"] < 2 * HALF, run
        status = subprocess.run(["pgrep", "-f", f"while \\[ ! -e {stop}"], capture_output=True, check=False)
        assert status.returncode == 0  # the job is still running
    finally:
        filler.unlink()  # space returns
    stop.touch()
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "120s", check=False)
    assert w.returncode == 0, (w.stdout, w.stderr)
    out = js.cli("logs", run_id).stdout.splitlines()
    assert out == [f"line-{i}" for i in range(1, 2 * HALF + 1)] + ["last"]  # each line once, in order
    events = [json.loads(line) for line in js.cli("events", run_id, "-o", "json").stdout.splitlines()]
    trouble = [e["data"] for e in events if e["type"] == "StorageTrouble"]
    assert trouble and trouble[0]["kind"] == "disk full" and trouble[0]["resumed_at"] >= trouble[0]["since"], trouble
    assert any(e.get("event") == "store.write_resumed" for e in _daemon_log_events(js))
