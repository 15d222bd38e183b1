"""End to end: the real daemon, the real CLI, real processes and SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, live_pids_with_arg, make_repo

pytestmark = [pytest.mark.timeout(180), pytest.mark.daemon]  # js: the daemon runs


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "proj",
        {
            "job.sh": "echo out-1\necho err-1 >&2\necho out-2\nprintf 'last-no-newline'\n",
            "fail.sh": "echo about to fail\nexit 7\n",
            "count.py": (
                "import sys, time\n"
                "n = int(sys.argv[1]); pause = float(sys.argv[2])\n"
                "for i in range(1, n + 1):\n"
                "    print(i, flush=True)\n"
                "    if i % 100 == 0: time.sleep(pause)\n"
            ),
            "task.yaml": "name: hello\nrun: bash job.sh\ntimeout: 5m\nenv:\n  TOKEN: s3cr3t-value\n",
        },
    )


def _pgrp_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def test_submit_logs_wait_completed(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "task.yaml")
    w = js.cli("wait", run_id, check=False)
    assert w.returncode == 0, w.stderr
    lines = js.cli("logs", run_id).stdout.splitlines()
    # Each stream keeps its order (their interleaving: test_local_output_order.py).
    assert [l for l in lines if l.startswith(("out", "last"))] == ["out-1", "out-2", "last-no-newline"]
    assert "err-1" in lines and len(lines) == 4
    shown = js.show(run_id)
    assert shown["phase"] == "COMPLETED" and shown["exit_code"] == 0
    assert shown["name"] == "hello" and shown["project"] == "proj"
    # The env value never appears: only its name and a hash.
    assert "s3cr3t-value" not in json.dumps(shown)
    events = js.cli("events", run_id, "-o", "json").stdout
    assert "s3cr3t-value" not in events
    types = [json.loads(l)["type"] for l in events.splitlines()]
    assert types[0] == "Submitted" and "PhaseChanged" in types and "LogLines" in types
    assert "s3cr3t-value" not in js.daemon_log.read_text()


def test_failing_job_exits_1_with_nonzeroexit(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "bash", "fail.sh")
    w = js.cli("wait", run_id, "-o", "json", check=False)
    assert w.returncode == 1
    run = json.loads(w.stdout)[0]
    assert run["phase"] == "ERROR" and run["reason"] == "NonZeroExit" and run["exit_code"] == 7


def test_cancel_kills_the_whole_group(js: JobsupEnv, repo: Path) -> None:
    # A grandchild in the background plus a foreground sleeper.
    run_id = js.submit(repo, "--", "sleep 300 & sleep 300; echo never")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    status = js.runner_status(run_id)
    pgid = status["pgid"]
    assert _pgrp_members(pgid), "the job's process group should be running"
    js.cli("cancel", run_id)
    assert _pgrp_members(pgid) == []
    w = js.cli("wait", run_id, check=False)
    assert w.returncode == 3
    assert js.show(run_id)["phase"] == "CANCELED"


def test_timeout_is_deadline_exceeded(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--timeout", "1s", "--", "sleep 60")
    w = js.cli("wait", run_id, "-o", "json", check=False)
    assert w.returncode == 1
    assert json.loads(w.stdout)[0]["reason"] == "DeadlineExceeded"


def test_kill_9_daemon_loses_and_doubles_nothing(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "python3 count.py 10000 0.03")
    # Let it print some lines, then kill the daemon hard mid-stream.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if js.show(run_id)["log_lines"] > 500:
            break
        time.sleep(0.1)
    js.kill_daemon(signal.SIGKILL)
    time.sleep(1.0)  # the job keeps printing while no daemon runs
    js.start_daemon()
    assert js.cli("wait", run_id, "--timeout", "2m", check=False).returncode == 0
    lines = js.cli("logs", run_id).stdout.splitlines()
    assert lines == [str(i) for i in range(1, 10001)]
    # A third daemon start re-ingests nothing.
    js.stop_daemon()
    js.start_daemon()
    assert js.cli("logs", run_id).stdout.splitlines() == lines


def test_runner_gone_is_lost(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "echo started; sleep 300")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    status = js.runner_status(run_id)
    js.kill_daemon(signal.SIGKILL)
    # Simulate a reboot: the runner and the job die without a final status.
    os.kill(status["runner_pid"], signal.SIGKILL)
    os.killpg(status["pgid"], signal.SIGKILL)
    js.start_daemon()
    w = js.cli("wait", run_id, "-o", "json", "--timeout", "30s", check=False)
    assert w.returncode == 1
    run = json.loads(w.stdout)[0]
    assert run["reason"] == "Lost"


def test_200_concurrent_waiters(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "sleep 2; echo done")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "supervisord", "wait", run_id],
            env=js.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(200)
    ]
    results = [(p.wait(timeout=240), p.stderr.read() if p.stderr else "") for p in procs]
    failed = [(code, err) for code, err in results if code != 0]
    assert not failed, failed[:3]


def test_wait_after_seq_returns_at_once(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "echo hi")
    assert js.cli("wait", run_id, check=False).returncode == 0
    # A phase change with seq > 0 already happened: --for change returns at once.
    t0 = time.monotonic()
    assert js.cli("wait", run_id, "--for", "change", "--after", "0", "--timeout", "20s", check=False).returncode == 0
    assert time.monotonic() - t0 < 15
    last = js.show(run_id)["last_seq"]
    # Nothing changes after the last seq: times out with 124.
    r = js.cli("wait", run_id, "--for", "change", "--after", str(last), "--timeout", "1s", check=False)
    assert r.returncode == 124


def test_bad_input_is_refused_and_nothing_recorded(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    def n_runs() -> int:
        return len(json.loads(js.cli("runs", "--all", "-o", "json").stdout))

    before = n_runs()
    r = js.cli("wait", "abcdef123456", check=False)
    assert r.returncode != 0 and "no run matches" in r.stderr
    r = js.cli("show", "zz", check=False)
    assert r.returncode != 0 and "4+" in r.stderr
    (repo / "bad.yaml").write_text("run: [unclosed\n")
    r = js.cli("submit", "bad.yaml", cwd=repo, check=False)
    assert r.returncode == 2 and "bad.yaml" in r.stderr and "line" in r.stderr
    r = js.cli("submit", "--timeout", "10x", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--timeout" in r.stderr
    r = js.cli("submit", "--timeout", "0s", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--timeout" in r.stderr
    outside = tmp_path / "not-a-repo"
    outside.mkdir()
    r = js.cli("submit", "--", "true", cwd=outside, check=False)
    assert r.returncode == 2 and "not inside a git repository" in r.stderr
    assert n_runs() == before


def test_in_flight_guard_and_force(js: JobsupEnv, repo: Path) -> None:
    first = js.submit(repo, "--name", "guarded", "--", "sleep 30")
    r = js.cli("submit", "--name", "guarded", "--", "true", cwd=repo, check=False)
    assert r.returncode != 0 and first in r.stderr
    second = js.submit(repo, "--name", "guarded", "--force", "--", "true")
    assert second != first
    js.cli("cancel", first)


def test_dirty_tree_warns_and_runs_the_commit(js: JobsupEnv, repo: Path) -> None:
    (repo / "job.sh").write_text("echo uncommitted\n")
    r = js.cli("submit", "--follow", "--", "bash job.sh", cwd=repo, check=False)
    assert r.returncode == 0, r.stderr
    assert "uncommitted changes" in r.stderr
    assert "out-1" in r.stdout and "uncommitted" not in r.stdout


def test_logs_tail_and_follow(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "for i in $(seq 1 50); do echo line-$i; done; sleep 2; echo late")
    follow = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "logs", "-f", run_id],
        env=js.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert out.splitlines() == [f"line-{i}" for i in range(1, 51)] + ["late"]
    assert "COMPLETED" in err
    tail = js.cli("logs", run_id, "--tail", "3").stdout.splitlines()
    assert tail == ["line-49", "line-50", "late"]
    as_json = [json.loads(l) for l in js.cli("logs", run_id, "--tail", "1", "-o", "json").stdout.splitlines()]
    # -o json: each line's stream and time (when it was recorded)
    assert as_json[0]["at"].endswith("Z")
    assert as_json == [{"line_no": 51, "stream": "stdout", "at": as_json[0]["at"], "attempt": 1, "text": "late"}]


def test_events_follow_sees_new_events(js: JobsupEnv, repo: Path) -> None:
    last = max([0] + [json.loads(l)["seq"] for l in js.cli("events", "-o", "json").stdout.splitlines()])
    follower = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "events", "-f", "--after", str(last), "-o", "json"],
        env=js.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[dict[str, object]] = []

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            seen.append(json.loads(line))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    run_id = js.submit(repo, "--", "echo followed")
    assert js.cli("wait", run_id, check=False).returncode == 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(e.get("data", {}).get("phase") == "COMPLETED" for e in seen):
        time.sleep(0.05)
    follower.terminate()
    follower.wait(timeout=10)
    assert seen and seen[0]["seq"] == last + 1 and seen[0]["type"] == "Submitted"
    seqs = [e["seq"] for e in seen]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {e["run_id"] for e in seen} == {run_id}


def test_submit_follow_exits_like_wait(js: JobsupEnv, repo: Path) -> None:
    r = js.cli("submit", "--follow", "--", "bash fail.sh", cwd=repo, check=False)
    assert r.returncode == 1
    assert "about to fail" in r.stdout and "NonZeroExit" in r.stderr


def test_cancel_reaches_processes_that_left_the_group(js: JobsupEnv, repo: Path) -> None:
    # One escapes with setsid, one also ignores SIGTERM; both must be gone.
    cmd = 'setsid sleep 1003 & ( setsid bash -c "trap \\"\\" TERM; exec sleep 1005" & ); echo started; wait'
    run_id = js.submit(repo, "--", cmd)
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(live_pids_with_arg("sleep\x00100")) < 2:
        time.sleep(0.05)
    assert live_pids_with_arg("sleep\x001003") and live_pids_with_arg("sleep\x001005")
    js.cli("cancel", run_id)
    assert live_pids_with_arg("sleep\x001003") == [] and live_pids_with_arg("sleep\x001005") == []


def test_a_daemonized_leftover_is_stopped_when_the_job_ends(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "( setsid sleep 1007 & ); echo done")
    assert js.cli("wait", run_id, check=False).returncode == 0
    assert live_pids_with_arg("sleep\x001007") == []


def test_lost_run_leaves_nothing_running(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "sleep 1009")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    status = js.runner_status(run_id)
    os.kill(status["runner_pid"], signal.SIGKILL)
    r = js.cli("wait", run_id, "-o", "json", "--timeout", "30s", check=False)
    assert r.returncode == 1 and json.loads(r.stdout)[0]["reason"] == "Lost"
    assert live_pids_with_arg("sleep\x001009") == []


def test_symlinks_in_the_repo_are_kept(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    (repo / "abs-link").symlink_to("/etc/hostname")
    (repo / "up-link").symlink_to("../elsewhere")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(repo)]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "links"], check=True)
    run_id = js.submit(repo, "--", "readlink abs-link up-link")
    assert js.cli("wait", run_id, check=False).returncode == 0
    assert js.cli("logs", run_id).stdout.splitlines() == ["/etc/hostname", "../elsewhere"]


def test_huge_timeout_is_refused(js: JobsupEnv, repo: Path) -> None:
    r = js.cli("submit", "--timeout", "99999999999d", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--timeout" in r.stderr and "366d" in r.stderr


def test_wait_for_a_phase_already_passed_returns_at_once(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "sleep 20")
    assert js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "30s", check=False).returncode == 0
    assert js.cli("wait", run_id, "--for", "STAGING", "--timeout", "5s", check=False).returncode == 0
    js.cli("cancel", run_id)


def test_audit_trail_is_in_causal_order(js: JobsupEnv, repo: Path) -> None:
    for _ in range(5):
        run_id = js.submit(repo, "--force", "--", "echo hi")
        assert js.cli("wait", run_id, check=False).returncode == 0
        evs = [json.loads(l) for l in js.cli("events", run_id, "-o", "json").stdout.splitlines()]
        kinds = [e["data"].get("phase", e["type"]) if e["type"] == "PhaseChanged" else e["type"] for e in evs]
        assert kinds.index("RUNNING") < kinds.index("LogLines"), kinds
        assert kinds.index("STAGING") < kinds.index("RUNNING"), kinds


def test_streams_survive_a_daemon_restart(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "for i in $(seq 1 30); do echo n$i; sleep 0.2; done")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "wait", run_id],
        env=js.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "supervisord", "logs", "-f", run_id],
        env=js.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)
    js.kill_daemon(signal.SIGKILL)
    time.sleep(1.0)
    js.start_daemon()
    assert waiter.wait(timeout=90) == 0, waiter.stderr.read() if waiter.stderr else ""
    out, err = follower.communicate(timeout=90)
    assert follower.returncode == 0, err
    assert out.splitlines() == [f"n{i}" for i in range(1, 31)]
    assert "reconnecting" in err


@pytest.mark.gpus
def test_task_and_name_validation(js: JobsupEnv, repo: Path) -> None:
    (repo / "dup.yaml").write_text("run: echo a\nrun: echo b\n")
    r = js.cli("submit", "dup.yaml", cwd=repo, check=False)
    assert r.returncode == 2 and "dup.yaml" in r.stderr and "line 2" in r.stderr
    r = js.cli("submit", "--name", "", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--name" in r.stderr
    r = js.cli("submit", "--name", "x" * 64, "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "63" in r.stderr
    # Local runs get GPUs from the scheduler: more than the machine has is
    # refused with the count; a Kubernetes run's GPUs stay in its manifest.
    r = js.cli("submit", "--gpus", "2", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "--gpus" in r.stderr and "has 0" in r.stderr
    r = js.cli("submit", "--backend", "kubernetes", "--gpus", "2", "--", "true", cwd=repo, check=False)
    assert r.returncode == 2 and "manifest" in r.stderr
    (repo / "listcfg.yaml").write_text("run: echo a\nconfig: []\n")
    r = js.cli("submit", "listcfg.yaml", cwd=repo, check=False)
    assert r.returncode == 2 and "config" in r.stderr


def test_untracked_files_are_named_in_a_warning(js: JobsupEnv, repo: Path) -> None:
    (repo / "new_script.py").write_text("print('never committed')\n")
    r = js.cli("submit", "--", "ls", cwd=repo)
    assert "untracked" in r.stderr and "new_script.py" in r.stderr


def test_env_digests_are_keyed(js: JobsupEnv, repo: Path) -> None:
    import hashlib

    run_id = js.submit(repo, "--env", "PIN=1234", "--", "true")
    digest = js.show(run_id)["env"]["PIN"]
    assert digest.startswith("hmac-sha256:")
    assert hashlib.sha256(b"1234").hexdigest() not in digest


def test_doctor_reports_a_missing_daemon(js: JobsupEnv) -> None:
    js.stop_daemon()
    # Exit 69 as every command when no daemon answers; the table says no,
    # not a Python bool.
    r = js.cli("doctor", check=False)
    assert r.returncode == 69, r.stdout + r.stderr
    row = r.stdout.splitlines()[1].split()
    assert row[:2] == ["daemon", "no"], r.stdout
    assert "False" not in r.stdout, r.stdout
    r = js.cli("doctor", "-o", "json", check=False)
    assert r.returncode == 69 and json.loads(r.stdout)[0]["ok"] is False, r.stdout


def test_a_commit_with_no_files_runs_in_an_empty_folder(js: JobsupEnv, tmp_path: Path) -> None:
    """``git archive`` of a commit without files is zero blocks only, which
    tarfile refuses ("end of file header"): the run used to end
    StagingFailed. It runs, in an empty source folder."""
    empty = tmp_path / "empty"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(empty)], check=True)
    subprocess.run([*git, "-C", str(empty), "commit", "-q", "--allow-empty", "-m", "nothing"], check=True)
    run_id = js.submit(empty, "--", "ls -A | wc -l")
    w = js.cli("wait", run_id, "-o", "json", check=False)
    assert w.returncode == 0, (w.stdout, w.stderr)
    assert js.cli("logs", run_id).stdout.split() == ["0"]
