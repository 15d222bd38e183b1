"""What a run used, end to end: the real daemon and CLI, real local jobs
sampled with a short ``local.usage_interval_s``; a job past its ``--memory``
is stopped ERROR ``OOMKilled`` and nothing else is touched."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisord.shared import schemas
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(180)

# Allocates MB megabytes in a child that left the job's session (setsid), so
# only the environment marker / the subreaper ties it to the run; then sleeps.
HOG = (
    "import os, sys, time\n"
    "mb, secs = int(sys.argv[1]), float(sys.argv[2])\n"
    "if len(sys.argv) > 3 and os.fork() == 0:\n"
    "    os.setsid()\n"
    "    block = bytearray(mb << 20)\n"
    "    for i in range(0, len(block), 4096): block[i] = 1\n"
    "    time.sleep(secs)\n"
    "    os._exit(0)\n"
    "x = sum(i * i for i in range(200000))\n"
    "time.sleep(secs)\n"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"hog.py": HOG})


def _daemon(js: JobsupEnv) -> None:
    js.daemon_config("local:\n  usage_interval_s: 0.5\n")
    js.start_daemon()


def _wait_terminal(js: JobsupEnv, run_id: str) -> dict[str, Any]:
    js.cli("wait", run_id, "--timeout", "120s", check=False)
    return js.show(run_id)


def _events(js: JobsupEnv, run_id: str, type_: str) -> list[dict[str, Any]]:
    out = js.cli("events", run_id, "-o", "json").stdout
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [e for e in events if e["type"] == type_]


def test_times_placement_and_usage_on_the_run(js: JobsupEnv, repo: Path) -> None:
    _daemon(js)
    rid = js.submit(repo, "--name", "u", "--priority", "3", "--", f"{sys.executable} hog.py 30 2 child")
    run = _wait_terminal(js, rid)
    assert run["phase"] == "COMPLETED", run
    assert run["started_at"] and run["ended_at"] and run["started_at"] <= run["ended_at"]
    assert run["elapsed_s"] >= 1.5 and run["queue"] == "default" and run["priority"] == 3 and run["gpus"] == []
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the final record follows the terminal phase
        records = _events(js, rid, "ResourceUsage")
        if records and records[-1]["data"]["final"]:
            break
        time.sleep(0.2)
    assert records[-1]["data"]["final"] is True and not any(r["data"]["final"] for r in records[:-1])
    assert len(records) == 2  # one while it ran (at most one a minute) and one at its end
    run = js.show(rid)
    usage = run["usage"]
    # the setsid child's 30 MB count: the whole tree, not the job's group only
    assert usage["max_rss_bytes"] >= 30 << 20, usage
    assert usage["cpu_s"] > 0
    schemas.validate("run-detail", run)
    for e in _events(js, rid, "ResourceUsage") + _events(js, rid, "Admitted"):
        schemas.validate("event", e)
    table = js.cli("runs").stdout
    assert "STARTED" in table and "ELAPSED" in table and "GPUS" in table
    shown = js.cli("show", rid).stdout
    assert "elapsed_s:" in shown and "max_rss:" in shown


def test_over_memory_is_oomkilled_and_nothing_else_is_touched(js: JobsupEnv, repo: Path) -> None:
    _daemon(js)
    # a process of ours, not the run's, with the same command: never touched
    bystander = subprocess.Popen([sys.executable, str(repo / "hog.py"), "1", "60"])
    try:
        ok = js.submit(repo, "--name", "ok", "--memory", "200M", "--", f"{sys.executable} hog.py 5 1")
        big = js.submit(repo, "--name", "big", "--memory", "64M", "--", f"{sys.executable} hog.py 150 60 child")
        run = _wait_terminal(js, big)
        assert (run["phase"], run["reason"]) == ("ERROR", "OOMKilled"), run
        assert "over its --memory limit of 64M" in run["message"] and "bytes" in run["message"]
        assert run["usage"]["max_rss_bytes"] > 64 << 20
        assert _wait_terminal(js, ok)["phase"] == "COMPLETED"
        assert bystander.poll() is None
        schemas.validate("event", _events(js, big, "Admitted")[0])
        admitted = _events(js, big, "Admitted")[0]["data"]
        assert admitted["limits"] == {"memory_bytes": 64 << 20, "cpus": None, "enforcement": "sampler"}
        doctor = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
        usage = next(c for c in doctor if c["name"] == "usage")
        assert "enforced by the daemon sampler" in usage["detail"]
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--memory", "0"), "--memory: must be more than 0"),
        (("--memory", "10XB"), "--memory: '10XB' is not a memory size"),
        (("--memory", "100T"), "--memory: asks for 100T, this machine has"),
        (("--cpus", "4096"), "--cpus: asks for 4096, this machine has"),
        (("--cpus", "-1"), "--cpus: must be more than 0"),
        (("--backend", "kubernetes", "--memory", "1G"), "--memory: only local runs take limits"),
    ],
)
def test_bad_limits_are_one_error_and_record_nothing(
    js: JobsupEnv, repo: Path, args: tuple[str, ...], needle: str
) -> None:
    if js.daemon is None:
        js.start_daemon()
    r = js.cli("submit", *args, "--", "true", cwd=repo, check=False)
    assert r.returncode == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert json.loads(js.cli("runs", "--all", "-o", "json").stdout) == []


def test_top_shows_running_runs(js: JobsupEnv, repo: Path) -> None:
    _daemon(js)
    rid = js.submit(repo, "--name", "t", "--", f"{sys.executable} hog.py 20 30 child")
    deadline = time.monotonic() + 60
    row: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = json.loads(js.cli("top", "-o", "json").stdout)
        schemas.validate("top", doc)
        rows = [r for r in doc["runs"] if r["id"] == rid]
        if rows and rows[0]["cpu_percent"] is not None and rows[0]["rss_bytes"] >= 20 << 20:
            row = rows[0]
            break
        time.sleep(0.3)
    assert row, "the run never showed in top"
    assert row["processes"] >= 2 and row["elapsed_s"] is not None
    # the table, once (not a terminal: one frame)
    out = js.cli("top", "--once").stdout
    assert rid in out and "RSS" in out
    js.cli("cancel", rid)
    assert os.environ.get("JOBSUP_RUN_ID") != rid


def test_a_reservation_is_explained_where_the_user_looks(js: JobsupEnv, repo: Path) -> None:
    js.daemon_config("scheduler:\n  gpus: [0, 1, 2, 3]\n")
    js.start_daemon()
    holders = [js.submit(repo, "--name", f"h{i}", "--gpus", "1", "--timeout", "2h", "--", "sleep 60") for i in range(3)]
    big = js.submit(repo, "--name", "big", "--gpus", "4", "--", "true")
    long = js.submit(repo, "--name", "long", "--gpus", "1", "--timeout", "4h", "--", "sleep 1")
    deadline = time.monotonic() + 60
    queue: dict[str, Any] = {}
    while time.monotonic() < deadline:
        queue = json.loads(js.cli("queue", "-o", "json").stdout)
        reasons = {w["id"]: w["reason"] for w in queue["waiting"]}
        if queue.get("reservation") and reasons.get(long) == "WaitingForGPUs":
            break
        time.sleep(0.3)
    schemas.validate("queue", queue)
    res = queue["reservation"]
    assert res["run_id"] == big and res["needs"] == 4 and res["gpus"] == [0, 1, 2, 3]
    assert res["message"].startswith(f"GPUs 0-3 reserved for run {big} (needs 4) from about ")
    assert re.search(r"; a run with --timeout under (1h5\dm|2h) could start now$", res["message"]), res
    # The QUEUED message names the reservation (the part that stays while the same runs hold the GPUs).
    assert js.show(long)["message"].startswith(f"needs 1 GPU; GPUs 0-3 reserved for run {big} (needs 4) from about ")
    assert "; GPUs 0-3 reserved for it from about " in js.show(big)["message"], js.show(big)
    table = js.cli("queue").stdout
    assert f"free, reserved for {big}" in table and res["message"] in table
    # a run short enough starts now on the free GPU
    short = js.submit(repo, "--name", "short", "--gpus", "1", "--timeout", "10m", "--", "true")
    js.cli("wait", short, "--timeout", "60s")
    assert js.show(short)["phase"] == "COMPLETED" and js.show(big)["phase"] == "QUEUED"
    # The passes for short's submit, start and end recorded nothing more for
    # the waiting runs: their messages did not change.
    for rid in (big, long):
        queued = [e for e in _events(js, rid, "PhaseChanged") if e["data"]["reason"] == "WaitingForGPUs"]
        assert len(queued) == 1, queued
    js.cli("cancel", *holders, big, long)


def test_memory_and_cpus_are_admitted_from_the_configured_capacity(js: JobsupEnv, repo: Path) -> None:
    js.daemon_config("scheduler:\n  memory: 100M\n  cpus: 2\n")
    js.start_daemon()
    first = js.submit(repo, "--name", "a", "--memory", "80M", "--cpus", "1", "--", "sleep 60")
    second = js.submit(repo, "--name", "b", "--memory", "80M", "--", "true")
    third = js.submit(repo, "--name", "c", "--cpus", "1.5", "--", "true")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        waiting = {js.show(r)["reason"] for r in (second, third)}
        if waiting == {"WaitingForMemory", "WaitingForCPUs"}:
            break
        time.sleep(0.3)
    assert js.show(second)["message"] == "needs 80M of memory, 20M of 100M unclaimed (scheduler.memory)"
    assert js.show(third)["message"] == "needs 1.5 CPUs, 1 of 2 unclaimed (scheduler.cpus)"
    r = js.cli("submit", "--memory", "101M", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "this machine has 100M for jobsup (scheduler.memory)" in r.stderr
    js.cli("cancel", first)
    js.cli("wait", second, third, "--timeout", "60s")
    assert js.show(second)["phase"] == js.show(third)["phase"] == "COMPLETED"


@pytest.mark.slow
def test_update_memory_and_cpus_of_queued_runs_reevaluates_admission(js: JobsupEnv, repo: Path) -> None:
    js.daemon_config("scheduler:\n  memory: 100M\n  cpus: 2\n")
    js.start_daemon()
    first = js.submit(repo, "--name", "a", "--memory", "80M", "--cpus", "1", "--", "sleep 60")
    second = js.submit(repo, "--name", "b", "--memory", "80M", "--", "true")
    third = js.submit(repo, "--name", "c", "--cpus", "1.5", "--", "true")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if {js.show(r)["reason"] for r in (second, third)} == {"WaitingForMemory", "WaitingForCPUs"}:
            break
        time.sleep(0.3)
    # More than the machine has: refused for every run, nothing recorded.
    r = js.cli("update", second, third, "--memory", "101M", check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--memory: asks for 101M, this machine has 100M for jobsup" in r.stderr
    bad = js.cli("update", second, "--cpus", "none", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --cpus:"), bad.stderr
    assert _events(js, second, "RunUpdated") == [] and _events(js, third, "RunUpdated") == []
    # All or nothing: a run past QUEUED refuses the command for both.
    past = js.cli("update", second, first, "--memory", "10M", check=False)
    assert past.returncode == 2 and f"run {first} is RUNNING" in past.stderr, past.stderr
    assert _events(js, second, "RunUpdated") == []
    # Less than is unclaimed: admitted at once.
    out = js.cli("update", second, "--memory", "10M")
    assert out.stdout.strip() == f"run {second}: memory 80M -> 10M", out.stdout
    js.cli("update", third, "--cpus", "1")
    js.cli("wait", second, third, "--timeout", "60s")
    (ev,) = _events(js, second, "RunUpdated")
    assert ev["data"] == {"old": {"memory_bytes": 80 << 20}, "new": {"memory_bytes": 10 << 20}}
    schemas.validate("event", ev)
    (adm,) = _events(js, second, "Admitted")
    assert adm["data"]["limits"]["memory_bytes"] == 10 << 20  # the limit it ran under
    (ev3,) = _events(js, third, "RunUpdated")
    assert ev3["data"] == {"old": {"cpus": 1.5}, "new": {"cpus": 1.0}}
    js.cli("cancel", first)


def test_a_run_shorter_than_the_interval_still_gets_its_usage(js: JobsupEnv, repo: Path) -> None:
    js.daemon_config("local:\n  usage_interval_s: 60\n")  # the sampler never sees it
    js.start_daemon()
    rid = js.submit(repo, "--name", "quick", "--", f"{sys.executable} -c \"b = b'x' * (40 << 20)\"")
    run = _wait_terminal(js, rid)
    assert run["phase"] == "COMPLETED", run
    (record,) = _events(js, rid, "ResourceUsage")
    schemas.validate("event", record)
    data = record["data"]
    assert data["source"] == "runner" and data["final"] is True
    # the python process's own peak (its 40 MB): the largest one process
    assert data["max_rss_bytes"] >= 40 << 20 and data["cpu_s"] > 0, data
    ended = [e for e in _events(js, rid, "PhaseChanged") if e["data"]["phase"] == "COMPLETED"]
    assert record["seq"] < ended[0]["seq"]  # recorded with the end, before the terminal phase
    assert run["usage"]["max_rss_bytes"] == data["max_rss_bytes"], run["usage"]


def test_a_reload_keeps_the_capacity_limits_are_admitted_from(js: JobsupEnv, repo: Path) -> None:
    # A reload used to set the scheduler's settings without the capacity:
    # every --memory/--cpus was admitted afterwards, however large.
    js.daemon_config("scheduler:\n  memory: 100M\n  cpus: 2\n")
    js.start_daemon()
    js.cli("daemon", "reload")
    r = js.cli("submit", "--memory", "101M", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "this machine has 100M for jobsup (scheduler.memory)" in r.stderr, r.stderr
    r = js.cli("submit", "--cpus", "3", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--cpus: asks for 3" in r.stderr, r.stderr


@pytest.mark.slow
def test_every_attempt_of_a_retried_run_is_held_to_its_memory_limit(js: JobsupEnv, tmp_path: Path) -> None:
    # The watchdog's "stopping" mark of attempt 1 used to carry over to
    # attempt 2, which then ran over its limit to the end (COMPLETED).
    _daemon(js)
    task = (
        "name: hog\n"
        f"run: {sys.executable} hog.py 150 30 child\n"
        "memory: 64M\n"
        "retry: {attempts: 1, on: [OOMKilled], backoff: 0s}\n"
    )
    repo = make_repo(tmp_path / "retried", {"hog.py": HOG, "task.yaml": task})
    rid = js.submit(repo, "task.yaml")
    run = _wait_terminal(js, rid)
    evs = js.cli("events", rid, "-o", "json").stdout
    assert (run["phase"], run["reason"]) == ("ERROR", "OOMKilled"), evs
    assert [e["data"]["attempt"] for e in _events(js, rid, "AttemptEnded")] == [1]
    assert len(_events(js, rid, "AttemptStarted")) == 1
