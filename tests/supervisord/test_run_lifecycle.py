"""Run lifecycle races and leaks of the local backend: the real daemon, the real CLI, real processes and SQLite."""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from pathlib import Path

import httpx
import pytest

from supervisord.daemon.backends.local.backend import run_processes
from tests.supervisord.jobsup_env import JobsupEnv, live_pids_with_arg

pytestmark = [pytest.mark.timeout(300), pytest.mark.daemon]


def test_cancel_after_a_normal_exit_keeps_completed(js: JobsupEnv, repo: Path) -> None:
    """A run whose process exited 0 before the cancel request (but
    before the daemon saw it) is COMPLETED, and cancel returns it so."""
    for i in range(5):
        run_id = js.submit(repo, "--name", f"race{i}", "--", "echo hi")
        deadline = time.monotonic() + 30
        while True:
            try:
                if js.runner_status(run_id).get("state") == "exited":
                    break
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline
            time.sleep(0.005)
        r = js.cli("cancel", run_id, "-o", "json", check=False)
        run = js.show(run_id)
        assert run["phase"] == "COMPLETED" and run["exit_code"] == 0, (i, run, r.stdout, r.stderr)
        assert r.returncode == 0, r.stderr
        assert "COMPLETED" in r.stdout + r.stderr, (r.stdout, r.stderr)


def test_a_job_cannot_rewrite_its_own_status(js: JobsupEnv, repo: Path) -> None:
    """A job that writes `state: exited` where its runner's status
    is (the old `../status.json`, and the new place outside its tree) does
    not end its run: the daemon takes only a status the runner signed, the
    run stays RUNNING, and cancel still stops it."""
    forged = json.dumps(
        {
            "state": "exited",
            "exit_code": 0,
            "signal": None,
            "reason": "Completed",
            "message": "forged",
            "finished_at": "2026-01-01T00:00:00Z",
        }
    )
    # The job forges only once its runner has recorded it running: the
    # runner starts the job before that write, which would otherwise
    # overwrite a forgery made first, before anyone could notice it (the
    # run is then fine, but the test below would wait for nothing).
    cmd = (
        "until grep -q '\"running\"' ../../.status/$JOBSUP_RUN_ID 2>/dev/null; do sleep 0.05; done; "
        f"printf '%s' '{forged}' > ../status.json; "
        f"printf '%s\\n%s\\n' '{forged}' {'0' * 64} > ../../.status/$JOBSUP_RUN_ID; "
        "echo forged; sleep 1021"
    )
    run_id = js.submit(repo, "--", cmd)
    deadline = time.monotonic() + 180
    while "forged" not in js.cli("logs", run_id).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # The daemon refused the forged record, or the runner had already put
    # its own back: wait for either (a loaded machine can take seconds for
    # the next status poll or check), not a fixed time.
    runner_log = js.state_dir / "runs" / run_id / "runner.log"
    deadline = time.monotonic() + 60
    while not ("local.status_rejected" in js.daemon_log.read_text() or "rewritten" in runner_log.read_text()):
        assert time.monotonic() < deadline, "neither the daemon nor the runner noticed the forged status"
        time.sleep(0.1)
    time.sleep(1)  # one more status poll after it: the forged record did not end the run
    assert js.show(run_id)["phase"] == "RUNNING"
    assert live_pids_with_arg("sleep\x001021")
    js.cli("cancel", run_id)
    assert js.show(run_id)["phase"] == "CANCELED"
    assert run_processes(run_id) == []


def test_lost_kills_setsid_survivors(js: JobsupEnv, repo: Path) -> None:
    """When the runner dies (kill -9), the run is ERROR Lost and
    every process of its job is stopped, also those that left its process
    group with setsid (found by JOBSUP_RUN_ID in their environment)."""
    run_id = js.submit(repo, "--", "setsid sleep 1031 & ( setsid sleep 1033 & ); echo started; sleep 1035")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    deadline = time.monotonic() + 10
    while len(live_pids_with_arg("sleep\x00103")) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(js.runner_status(run_id)["runner_pid"], signal.SIGKILL)
    r = js.cli("wait", run_id, "-o", "json", "--timeout", "30s", check=False)
    assert r.returncode == 1 and json.loads(r.stdout)[0]["reason"] == "Lost"
    assert live_pids_with_arg("sleep\x00103") == []


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_terminal_runs_and_env_values_leave_the_daemons_memory(js: JobsupEnv, repo: Path) -> None:
    """The daemon keeps no env value once its run started, and no
    unbounded memory per terminal run: 60 runs with 1 MB of env each (ten
    100 KB values: Linux caps one env string at 128 KB) grow the daemon's RSS
    by far less than the 60 MB they carried.

    Bounded caches do grow with the first runs (the store's window of recent
    events, the hooks' cache of Submitted data: some tens of KB per run up to
    their caps), so the margin is a third of the payload, not zero."""
    assert js.daemon is not None
    transport = httpx.HTTPTransport(uds=str(js.socket))
    value_size, values, n = 100_000, 10, 60

    def body(i: int) -> dict[str, object]:
        return {
            "task": {
                "name": f"mem{i}",
                "run": "true",
                "backend": "local",
                "timeout_s": 600,
                "env": {f"BIG{k}": secrets.token_hex(value_size // 2) for k in range(values)},
                "manifest": None,
                "path": None,
            },
            "layers": [],
            "cwd": str(repo),
            "rev": "HEAD",
            "force": True,
        }

    with httpx.Client(transport=transport, base_url="http://jobsup/v1", timeout=120) as http:

        def batch(start: int, count: int) -> None:
            ids = []
            for i in range(start, start + count):
                resp = http.post("/runs", json=body(i))
                assert resp.status_code == 201, resp.text
                ids.append(resp.json()["run"]["id"])
            deadline = time.monotonic() + 240
            while True:
                runs = {r["id"]: r for r in http.get("/runs", params={"all": "1"}).json()["runs"]}
                if all(runs[i]["phase"] in ("COMPLETED", "ERROR", "CANCELED") for i in ids):
                    break
                assert time.monotonic() < deadline
                time.sleep(0.2)

        batch(0, 10)  # warm up: the first runs' allocations
        before = _rss_kb(js.daemon.pid)
        batch(10, n)
        after = _rss_kb(js.daemon.pid)
    grown = after - before
    payload_kb = n * values * value_size // 1000
    print(f"daemon RSS {before} kB -> {after} kB (+{grown} kB) over {n} runs carrying {payload_kb} kB of env")
    assert grown < payload_kb / 3, f"the daemon grew {grown} kB over {n} runs carrying {payload_kb} kB of env"


def test_an_idle_runner_keeps_less_than_4mb_private(js: JobsupEnv, repo: Path) -> None:
    """A local run's runner is an isolated interpreter (-I -S) with
    only what it needs loaded: its Private_Dirty stays under 4 MB (it was
    ~9 MB); bench/local_runner_memory.py measures 5 and 500 of them."""
    run_id = js.submit(repo, "--", "sleep 1041")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    pid = js.runner_status(run_id)["runner_pid"]
    time.sleep(0.5)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"-I" in argv and b"-S" in argv, argv
    private = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        if line.startswith("Private_Dirty:")
    )
    assert private < 4096, f"runner Private_Dirty {private} kB"
    js.cli("cancel", run_id)
