"""Progress files end to end: a real local job writes JOBSUP_PROGRESS_FILE
as fast as it can (and garbage, and a huge file); the daemon records no
more Progress events than ``local.progress_interval_s`` allows, the last
report at the end, and the run object carries it."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(180)

FLOOD = (
    "import json, os, sys, time\n"
    "path = os.environ['JOBSUP_PROGRESS_FILE']\n"
    "secs = float(sys.argv[1])\n"
    "end = time.monotonic() + secs\n"
    "i = 0\n"
    "while time.monotonic() < end:\n"
    "    i += 1\n"
    "    with open(path, 'w') as f: f.write(json.dumps({'step': i, 'metrics': {'loss': 1 / i}}))\n"
    "    if i % 1000 == 0:\n"
    "        with open(path, 'wb') as f: f.write(os.urandom(64))\n"
    "with open(path, 'wb') as f: f.write(b'{\"step\": -1, \"message\": \"' + b'x' * 100000 + b'\"}')\n"
    "time.sleep(0.2)\n"
    "with open(path, 'w') as f: f.write(json.dumps({'step': i, 'total': i, 'message': 'done'}))\n"
    "print('writes', i)\n"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"flood.py": FLOOD})


def test_a_flood_of_progress_writes_is_rate_limited(js: JobsupEnv, repo: Path) -> None:
    js.daemon_config("local:\n  progress_interval_s: 1\n")
    js.start_daemon()
    run = js.submit(repo, "--", f"{sys.executable} flood.py 4")
    assert js.cli("wait", run).returncode == 0
    writes = int(js.cli("logs", run).stdout.split()[-1])
    assert writes > 1000  # the job was not slowed down to nothing
    db = sqlite3.connect(js.state_dir / "jobsup.db")
    rows = db.execute("SELECT at, data FROM events WHERE run_id = ? AND type = 'Progress' ORDER BY seq", (run,))
    reports = [json.loads(d) for _, d in rows.fetchall()]
    db.close()
    # ~4 s of writes at one report a second, plus the last one at the end.
    assert 1 <= len(reports) <= 4 / 1 + 3, reports
    assert reports[-1] == {"step": writes, "total": writes, "message": "done"}
    shown = js.show(run)
    assert shown["progress"]["message"] == "done" and shown["progress"]["step"] == writes
