"""A flood is bounded: `yes` for 3 seconds. The daemon's
memory stays under 150 MB while it ingests (backpressure: it reads no
faster than it commits), every byte is recorded once, and the text is kept
once (database bytes per log byte at most 1.3, the run's own file freed)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(900), pytest.mark.daemon]  # js: the daemon runs

MAX_RSS = 150 * 1024 * 1024


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def _db_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in (state / "jobsup.db", state / "jobsup.db-wal") if p.exists())


def test_yes_for_3_seconds_is_ingested_once_in_bounded_memory(js: JobsupEnv, tmp_path: Path) -> None:
    assert js.daemon is not None
    pid = js.daemon.pid
    repo = make_repo(tmp_path / "proj", {"README": "flood\n"})
    db_before = _db_bytes(js.state_dir)
    run_id = js.submit(repo, "--name", "flood", "--", "timeout 3 yes; true")
    peak = 0
    deadline = time.monotonic() + 800
    while True:
        peak = max(peak, _status_kb(pid, "VmRSS"))
        run = js.show(run_id)
        if run["phase"] == "COMPLETED" and run.get("log_ingest") != "pending":
            break
        assert run["phase"] in ("QUEUED", "SCHEDULING", "STAGING", "RUNNING", "COMPLETED"), run
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    hwm = _status_kb(pid, "VmHWM")  # the kernel's own high-water mark of the daemon's RSS
    events = [json.loads(line) for line in js.cli("events", run_id, "-o", "json").stdout.splitlines()]
    recorded = sum(e["data"].get("bytes", 0) for e in events if e["type"] == "LogLines")
    lines = js.show(run_id)["log_lines"]
    output_log = js.state_dir / "runs" / run_id / "output.log"
    print(
        f"flood: {recorded:,} bytes, {lines:,} lines; daemon RSS peak {peak / 2**20:.0f} MB, VmHWM {hwm / 2**20:.0f} MB"
    )
    assert recorded > 50 * 2**20, recorded  # a real flood, even on a loaded machine
    assert recorded == 2 * lines  # "y\n", each line once
    assert output_log.stat().st_size == recorded  # every byte the job wrote, recorded once
    assert output_log.stat().st_blocks * 512 < 16 * 2**20  # the run's file was the buffer: freed
    assert hwm < MAX_RSS, hwm
    # The text is stored once: the database grew by about the log's size.
    db_growth = _db_bytes(js.state_dir) - db_before
    print(f"database bytes per log byte: {db_growth / recorded:.3f}")
    assert db_growth / recorded <= 1.3
    # And it reads back: the last 3 lines through the real CLI.
    assert js.cli("logs", run_id, "--tail", "3").stdout == "y\ny\ny\n"
