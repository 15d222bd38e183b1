"""The runner finds the processes below it from its own children down
(``/proc/PID/task/TID/children``), not by reading every process's stat on
the machine: a cancel of 500 runs had each runner read all of /proc, twice
(about 2,000 processes each time: half a minute of CPU on 2 cores)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from supervisord.daemon.backends.local import runner


def test_descendants_without_reading_all_of_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.skip("this kernel has no /proc/PID/task/TID/children")
    ready = tmp_path / "ready"
    # A child, a grandchild in another session, and a great-grandchild.
    proc = subprocess.Popen(
        ["bash", "-c", f"setsid bash -c 'sleep 300 & touch {ready}; wait' & sleep 300 & wait"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        expected = runner._descendants_by_scan()
        assert len(expected) >= 4, expected
        listed: list[str] = []
        real_listdir = os.listdir

        def listdir(path: str) -> list[str]:
            listed.append(str(path))
            return real_listdir(path)

        monkeypatch.setattr(os, "listdir", listdir)
        assert runner._descendants() == expected
        assert "/proc" not in listed, listed
    finally:
        for pid in runner._descendants_by_scan():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()
