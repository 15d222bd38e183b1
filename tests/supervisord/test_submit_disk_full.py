"""C15: ``submit`` while the state dir's disk is full. ``git archive``
cannot write the source snapshot; the submit exited 2 (bad input) with
git's raw message. It now exits 1 naming the full state dir, records
nothing, and works again once space returns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv
from tests.supervisord.test_storage_trouble import _fill, full_js  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(180)


def test_submit_on_a_full_disk_exits_1_naming_the_state_dir(full_js: JobsupEnv, repo: Path) -> None:  # noqa: F811
    js = full_js
    js.start_daemon()
    filler = _fill(js.state_dir.parent)
    try:
        r = js.cli("submit", "--", "echo hi", cwd=repo, check=False)
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        assert r.stdout == ""
        assert f"the disk of the state dir {js.state_dir} is full" in r.stderr, r.stderr
        assert "fatal:" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        filler.unlink()
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []  # nothing recorded
    assert [p.name for p in (js.state_dir / "runs").iterdir()] == []  # no pending file left
    run_id = js.submit(repo, "--", "echo hi")
    assert js.cli("wait", run_id, "--timeout", "60s", check=False).returncode == 0
