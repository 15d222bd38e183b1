"""`jobsup update` end to end: the real daemon (one GPU, from config) and
CLI; a queued run's priority, GPUs, queue and timeout change, the scheduler
decides again at once, and a run past QUEUED refuses the whole command."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsupEnv]:
    with jobsup_env(tmp_path_factory.mktemp("update")) as env:
        env.daemon_config("scheduler:\n  gpus: [0]\n")
        env.start_daemon()
        yield env


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("proj") / "p", {"README": "x\n"})


def _events(js: JobsupEnv, run_id: str, etype: str) -> list[dict[str, Any]]:
    lines = js.cli("events", run_id, "-o", "json").stdout.splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == etype]


def _until(pred: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_update_a_held_run_records_old_and_new_and_show_has_them(js: JobsupEnv, repo: Path) -> None:
    rid = js.submit(repo, "--name", "u1", "--hold", "--timeout", "1h", "--", "true")
    out = js.cli("update", rid, "--priority", "7", "--timeout", "10m", "--queue", "fast")
    assert out.stdout.strip() == f"run {rid}: priority 0 -> 7, queue default -> fast, timeout_s 3600 -> 600"
    (ev,) = _events(js, rid, "RunUpdated")
    assert ev["data"] == {
        "old": {"priority": 0, "queue": "default", "timeout_s": 3600},
        "new": {"priority": 7, "queue": "fast", "timeout_s": 600},
    }
    doc = js.show(rid)
    assert doc["timeout_s"] == 600 and doc["updates"][0]["new"]["priority"] == 7
    # The run object has the new values too (show and runs read the run's facts).
    assert (doc["priority"], doc["queue"]) == (7, "fast"), doc
    (listed,) = [r for r in json.loads(js.cli("runs", "-o", "json").stdout) if r["id"] == rid]
    assert (listed["priority"], listed["queue"]) == (7, "fast"), listed
    queued = json.loads(js.cli("queue", "-o", "json").stdout)
    (row,) = [w for w in queued["waiting"] if w["id"] == rid]
    assert (row["priority"], row["queue"]) == (7, "fast")
    # The same values again: nothing recorded.
    again = js.cli("update", rid, "--priority", "7")
    assert "unchanged" in again.stdout
    assert len(_events(js, rid, "RunUpdated")) == 1
    js.cli("cancel", rid)


def test_update_gpus_lets_a_waiting_run_start_at_once(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = js.submit(repo, "--name", "holder", "--gpus", "1", "--", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    _until(lambda: js.show(holder)["phase"] == "RUNNING")
    waiter = js.submit(repo, "--name", "waiter", "--gpus", "1", "--", "echo ran")
    _until(lambda: js.show(waiter)["reason"] == "WaitingForGPUs")
    js.cli("update", waiter, "--gpus", "0")
    w = js.cli("wait", waiter, "--timeout", "120s", check=False)
    assert w.returncode == 0, w.stdout + w.stderr
    assert js.show(holder)["phase"] == "RUNNING"  # it did not wait for the GPU
    gate.touch()
    js.cli("wait", holder, "--timeout", "120s")


def test_update_is_all_or_nothing_and_names_the_run_past_queued(js: JobsupEnv, repo: Path) -> None:
    done = js.submit(repo, "--name", "done", "--", "true")
    js.cli("wait", done, "--timeout", "120s")
    held = js.submit(repo, "--name", "held", "--hold", "--", "true")
    bad = js.cli("update", held, done, "--priority", "3", check=False)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip() == (
        f"error: run {done} is COMPLETED: only a queued run can be updated; nothing was done"
    ), bad.stderr
    assert _events(js, held, "RunUpdated") == []
    js.cli("cancel", held)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--priority", "5000"], "--priority"),
        (["--timeout", "0s"], "--timeout"),
        (["--timeout", "soon"], "--timeout"),
        (["--gpus", "3"], "--gpus"),
        (["--queue", "bad name"], "--queue"),
        ([], "--priority"),
    ],
)
def test_update_bad_input_is_one_line_exit_2_and_records_nothing(
    js: JobsupEnv, repo: Path, args: list[str], names: str
) -> None:
    rid = js.submit(repo, "--name", "bad", "--hold", "--force", "--", "true")
    r = js.cli("update", rid, *args, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], r.stderr
    assert _events(js, rid, "RunUpdated") == []
    js.cli("cancel", rid)


def test_update_survives_a_daemon_restart(js: JobsupEnv, repo: Path) -> None:
    rid = js.submit(repo, "--name", "restart", "--hold", "--", "true")
    js.cli("update", rid, "--priority", "-5", "--queue", "slow")
    js.stop_daemon()
    js.start_daemon()
    queued = json.loads(js.cli("queue", "-o", "json").stdout)
    (row,) = [w for w in queued["waiting"] if w["id"] == rid]
    assert (row["priority"], row["queue"]) == (-5, "slow")
    js.cli("cancel", rid)


def test_an_updated_timeout_is_the_one_the_run_gets(js: JobsupEnv, repo: Path) -> None:
    rid = js.submit(repo, "--name", "short", "--hold", "--timeout", "1h", "--", "sleep 60")
    js.cli("update", rid, "--timeout", "2s")
    js.cli("release", rid)
    w = js.cli("wait", rid, "--timeout", "120s", check=False)
    assert w.returncode == 1, w.stdout + w.stderr
    assert js.show(rid)["reason"] == "DeadlineExceeded"


def test_update_outputs_match_their_schemas(js: JobsupEnv, repo: Path) -> None:
    from supervisord.shared import schemas

    rid = js.submit(repo, "--name", "schema", "--hold", "--", "true")
    doc = json.loads(js.cli("update", rid, "--priority", "1", "-o", "json").stdout)
    assert not schemas.schema_errors("update", doc), schemas.schema_errors("update", doc)
    assert not schemas.schema_errors("run-detail", js.show(rid))
    for ev in map(json.loads, js.cli("events", rid, "-o", "json").stdout.splitlines()):
        assert not schemas.schema_errors("event", ev), ev
    js.cli("cancel", rid)


def _queue_row(js: JobsupEnv, name: str) -> dict[str, Any]:
    doc = json.loads(js.cli("queue", "-o", "json").stdout)
    (row,) = [q for q in doc["queues"] if q["name"] == name]
    return dict(row)


def test_queue_set_caps_at_once_outlives_a_restart_and_config_comes_back(js: JobsupEnv, repo: Path) -> None:
    from supervisord.shared import schemas

    assert _queue_row(js, "default")["source"] == "none"
    out = js.cli("queue", "set", "capped", "--max-parallel", "1")
    assert "is new" in out.stderr and "max_parallel 1 (runtime)" in out.stdout, out
    (ev,) = [
        e
        for e in map(json.loads, js.cli("events", "-o", "json").stdout.splitlines())
        if e["type"] == "QueueChanged" and e["data"]["queue"] == "capped"
    ]
    assert ev["run_id"] == "daemon" and ev["data"]["max_parallel"] == 1 and ev["data"]["source_before"] == "none"
    assert not schemas.schema_errors("event", ev)
    gate = repo.parent / "gate-capped"
    first = js.submit(repo, "--name", "c1", "--queue", "capped", "--", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    _until(lambda: js.show(first)["phase"] == "RUNNING")
    second = js.submit(repo, "--name", "c2", "--queue", "capped", "--", "true")
    _until(lambda: js.show(second)["reason"] == "WaitingForSlot")
    js.stop_daemon()
    js.start_daemon()
    row = _queue_row(js, "capped")
    assert (row["max_parallel"], row["source"], row["running"], row["waiting"]) == (1, "runtime", 1, 1)
    assert not schemas.schema_errors("queue", json.loads(js.cli("queue", "-o", "json").stdout))
    table = js.cli("queue").stdout
    assert "capped" in table and "runtime" in table
    # Lifting the cap lets the second run start at once.
    js.cli("queue", "set", "capped", "--max-parallel", "none")
    js.cli("wait", second, "--timeout", "120s")
    assert js.show(first)["phase"] == "RUNNING"
    gate.touch()
    js.cli("wait", first, "--timeout", "120s")
    back = json.loads(js.cli("queue", "set", "capped", "--max-parallel", "config", "-o", "json").stdout)
    assert back["queue"]["source"] == "none" and back["new"] is False


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["q1", "--max-parallel", "0"], "--max-parallel"),
        (["q1", "--max-parallel", "lots"], "--max-parallel"),
        (["bad/name", "--max-parallel", "2"], "Q"),
        (["q1"], "--max-parallel"),
    ],
)
def test_queue_set_bad_input_is_one_line_exit_2(js: JobsupEnv, args: list[str], names: str) -> None:
    r = js.cli("queue", "set", *args, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], r.stderr
    assert "q1" not in {q["name"] for q in json.loads(js.cli("queue", "-o", "json").stdout)["queues"]}


def test_after_failed_starts_only_after_an_error(js: JobsupEnv, repo: Path) -> None:
    bad = js.submit(repo, "--name", "fails", "--", "exit 3")
    fix = js.submit(repo, "--name", "fixer", "--after-failed", bad, "--", "echo fixing")
    good = js.submit(repo, "--name", "passes", "--", "true")
    skip = js.submit(repo, "--name", "skipped", "--after-failed", good, "--", "echo never")
    assert js.cli("wait", fix, "--timeout", "120s", check=False).returncode == 0
    assert js.cli("wait", skip, "--timeout", "120s", check=False).returncode == 3
    show = js.show(skip)
    assert show["reason"] == "DependencyFailed" and "--after-failed" in show["message"], show
    (sub,) = _events(js, fix, "Submitted")
    assert sub["data"]["scheduling"]["after_failed"] == [bad]


def test_rerun_with_a_new_rev_a_new_command_and_its_dependents(js: JobsupEnv, tmp_path: Path) -> None:
    import subprocess

    proj = make_repo(tmp_path / "rr", {"v": "1\n"})
    first = js.submit(proj, "--name", "rr-a", "--", "cat v; exit 1")
    b = js.submit(proj, "--name", "rr-b", "--after", first, "--", "echo b")
    c = js.submit(proj, "--name", "rr-c", "--after", b, "--", "echo c")
    assert js.cli("wait", c, "--timeout", "120s", check=False).returncode == 3
    (proj / "v").write_text("2\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(proj)]
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    out = js.cli("rerun", first, "--rev", "main", "--with-dependents", "--", "cat v", cwd=proj)
    new_a, new_b, new_c = out.stdout.split()
    assert f"dependent {b} submitted again as {new_b}" in out.stderr, out.stderr
    js.cli("wait", new_a, new_b, new_c, "--timeout", "120s")
    assert js.cli("logs", new_a).stdout == "2\n"
    (sub,) = _events(js, new_c, "Submitted")
    assert sub["data"]["scheduling"]["after"] == [new_b] and sub["data"]["rerun_of"] == c
    (sub_a,) = _events(js, new_a, "Submitted")
    assert sub_a["data"]["command"] == "cat v" and sub_a["data"]["source"]["rev"] == "main"
    bad = js.cli("rerun", first, "--rev", "no-such-rev", check=False)
    assert bad.returncode == 2 and "--rev" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_hold_and_release_that_change_nothing_say_so(js: JobsupEnv, repo: Path) -> None:
    held = js.submit(repo, "--name", "rel", "--hold", "--", "true")
    again = js.cli("hold", held)
    assert again.returncode == 0 and f"note: run {held} was already held" in again.stderr, again.stderr
    assert _events(js, held, "Held") == []  # --hold at submit: no Held event, and none added
    # A queued run that is not held: exit 0, a note, nothing recorded.
    blocked = js.submit(repo, "--name", "rel2", "--after", held, "--", "true")
    _until(lambda: js.show(blocked)["reason"] == "WaitingForDependency")
    r = js.cli("release", blocked)
    assert r.returncode == 0
    assert f"note: run {blocked} was not held: nothing to release" in r.stderr, r.stderr
    assert f"run {blocked}: QUEUED (WaitingForDependency)" in r.stderr, r.stderr
    assert _events(js, blocked, "HoldReleased") == []
    doc = json.loads(js.cli("release", blocked, "-o", "json").stdout)
    assert [d["id"] for d in doc] == [blocked]  # -o json: the runs, as before
    done = js.cli("release", held)
    assert "note:" not in done.stderr, done.stderr
    js.cli("wait", held, blocked, "--timeout", "120s")
