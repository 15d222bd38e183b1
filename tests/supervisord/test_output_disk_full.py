"""C14: a runner that cannot write its run's output (the disk of the runs
folder is full) stops reading the job's pipes and the job blocks: nothing is
lost, but `runs` and `doctor` said all was fine (the store, with nothing to
ingest, never failed). They now say which running runs wait for space."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv
from tests.supervisord.test_storage_trouble import _fill, full_js  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(240)


@pytest.mark.slow
def test_runs_and_doctor_name_the_runs_waiting_for_space(full_js: JobsupEnv, repo: Path, tmp_path: Path) -> None:  # noqa: F811
    js = full_js
    js.start_daemon()
    go = tmp_path / "go"
    n = 20000
    run_id = js.submit(repo, "--", f"while [ ! -e {go} ]; do sleep 0.05; done; seq -f 'line-%.0f' 1 {n}; echo last")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "60s", check=False).returncode == 0
    r = js.cli("runs", "-o", "json")
    assert "output:" not in r.stderr, r.stderr  # room: nothing to say
    filler = _fill(js.state_dir.parent)
    try:
        go.touch()  # the job writes; its runner cannot
        deadline = time.monotonic() + 60
        while True:
            r = js.cli("runs", "-o", "json", check=False)
            if "output: the disk of" in r.stderr:
                break
            assert time.monotonic() < deadline, r.stderr
            time.sleep(0.2)
        assert r.returncode == 0 and run_id in r.stderr and str(js.state_dir / "runs") in r.stderr, r.stderr
        assert json.loads(r.stdout)[0]["phase"] == "RUNNING"
        d = js.cli("doctor", "-o", "json", check=False)
        assert d.stdout, (d.returncode, d.stderr)
        checks = json.loads(d.stdout)
        outputs = next(c for c in checks if c["name"] == "outputs")
        assert outputs["ok"] is False and run_id in outputs["detail"], outputs
    finally:
        filler.unlink()  # space returns
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "120s", check=False)
    assert w.returncode == 0, (w.stdout, w.stderr)
    assert js.cli("logs", run_id).stdout.splitlines() == [f"line-{i}" for i in range(1, n + 1)] + ["last"]
    checks = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
    assert next(c for c in checks if c["name"] == "outputs")["ok"] is True
