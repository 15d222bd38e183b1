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
    "n = int(sys.argv[1])\n"
    "i = 0\n"
    "while i < n:\n"
    "    i += 1\n"
    "    with open(path, 'w') as f: f.write(json.dumps({'step': i, 'metrics': {'loss': 1 / i}}))\n"
    "    if i % 500 == 0:\n"
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
    run = js.submit(repo, "--", f"{sys.executable} flood.py 3000")
    assert js.cli("wait", run, timeout=300).returncode == 0
    assert js.cli("logs", run).stdout.split() == ["writes", "3000"]
    db = sqlite3.connect(js.state_dir / "jobsup.db")
    rows = db.execute("SELECT type, at, data FROM events WHERE run_id = ? ORDER BY seq", (run,)).fetchall()
    db.close()
    reports = [json.loads(d) for t, _, d in rows if t == "Progress"]
    times = [
        parse_at(at) for t, at, d in rows if t == "PhaseChanged" and json.loads(d)["phase"] in ("RUNNING", "COMPLETED")
    ]
    span = times[-1] - times[0]
    # At most one report per interval while it ran, and the last one at the end.
    assert 1 <= len(reports) <= int(span / 1.0) + 2, (len(reports), span)
    assert reports[-1] == {"step": 3000, "total": 3000, "message": "done"}
    shown = js.show(run)
    assert shown["progress"]["message"] == "done" and shown["progress"]["step"] == 3000


def parse_at(at: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(at).timestamp()
