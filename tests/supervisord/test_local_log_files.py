"""A local run's output files are a buffer: what is committed is freed from
them (unless ``local.keep_log_files``), and ``local.max_log_bytes`` stops
recording (not the job) with ``LogsTruncated``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(300), pytest.mark.daemon]

N = 40_000
EMIT = "import sys\nsys.stdout.write(''.join('line %07d the quick brown fox jumps over the lazy dog 0123456789 abcdef\\n' % i for i in range(40000)))\n"
LINE_BYTES = 75


def _stdout_log(js: JobsupEnv, run_id: str) -> os.stat_result:
    """The run's output record data file (both streams)."""
    [path] = list(Path(js.env["JOBSUP_STATE_DIR"]).glob(f"runs/{run_id}/output.log"))
    return os.stat(path)


def test_committed_output_is_freed_from_the_run_files(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"emit.py": EMIT})
    freed = js.submit(repo, "--name", "freed", "--", "python3 emit.py")
    kept = js.submit(repo, "--name", "kept", "--config", "local.keep_log_files=true", "--", "python3 emit.py")
    for run_id in (freed, kept):
        js.cli("wait", run_id, "--timeout", "120s")
        out = js.cli("logs", run_id).stdout
        assert out.count("\n") == N and out.startswith("line 0000000 ") and "line 0039999" in out
    st = _stdout_log(js, freed)
    assert st.st_size == N * LINE_BYTES  # offsets unchanged
    assert st.st_blocks * 512 < 64 * 1024  # but the text is kept once: in the database
    st = _stdout_log(js, kept)
    assert st.st_blocks * 512 >= N * LINE_BYTES


def test_max_log_bytes_stops_recording_not_the_job(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"emit.py": EMIT})
    run_id = js.submit(repo, "--config", "local.max_log_bytes=1000000", "--", "python3 emit.py; echo done >&2")
    js.cli("wait", run_id, "--timeout", "120s")
    run = js.show(run_id)
    assert run["phase"] == "COMPLETED"
    events = [json.loads(line) for line in js.cli("events", run_id, "-o", "json").stdout.splitlines()]
    truncated = [e["data"] for e in events if e["type"] == "LogsTruncated"]
    assert truncated, [e["type"] for e in events]
    final = truncated[-1]
    assert final["final"] is True and final["max_log_bytes"] == 1_000_000
    assert final["recorded_bytes"] <= 1_000_000
    assert final["recorded_bytes"] + final["dropped_bytes"] == N * LINE_BYTES + len("done\n")
    recorded = sum(e["data"].get("bytes", 0) for e in events if e["type"] == "LogLines")
    assert recorded == final["recorded_bytes"]
    assert run["log_lines"] < N
