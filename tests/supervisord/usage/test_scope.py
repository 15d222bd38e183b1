"""Limits in systemd scopes: the start-up probe (a user manager answers, or
not, or hangs: then the sampler enforces), the command line a limited run
starts with, and the runner's reading of its scope's OOM kills. There is
no user systemd manager on the test machines: a fake ``systemd-run`` that
runs the command after ``--`` stands for one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from supervisord.daemon.backends.local.runner import oom_kills, scope_cgroup
from supervisord.daemon.scope import probe, scope_argv
from supervisord.shared.limits import ENFORCE_SAMPLER, ENFORCE_SYSTEMD
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(180)


def _fake(bin_dir: Path, body: str) -> dict[str, str]:
    bin_dir.mkdir(parents=True, exist_ok=True)
    prog = bin_dir / "systemd-run"
    prog.write_text("#!/bin/sh\n" + body)
    prog.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


# A user manager that answers: records its argv (one JSON line), then runs what follows `--`.
ANSWERS = (
    'python3 -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' "$@" >> "$(dirname "$0")/calls"\n'
    'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n'
)


def test_scope_argv_is_the_documented_command_line() -> None:
    assert scope_argv("/usr/bin/systemd-run", "abc123abc123", 16 << 30, 2.5) == [
        "/usr/bin/systemd-run",
        "--user",
        "--scope",
        "--quiet",
        "--collect",
        "--unit=jobsup-abc123abc123",
        "-p",
        f"MemoryMax={16 << 30}",
        "-p",
        "MemorySwapMax=0",
        "-p",
        "CPUQuota=250%",
        "--",
    ]
    assert scope_argv("systemd-run", "r", None, 0.5)[-3:] == ["-p", "CPUQuota=50%", "--"]
    assert "MemoryMax" not in " ".join(scope_argv("systemd-run", "r", None, 1.0))


def test_probe_falls_back_to_the_sampler_without_a_user_manager(tmp_path: Path) -> None:
    none = probe(env={**os.environ, "PATH": str(tmp_path / "empty")})
    assert none.enforcement == ENFORCE_SAMPLER and "no systemd-run" in none.detail and none.systemd_run is None
    env = _fake(tmp_path / "nobus", 'echo "Failed to connect to bus: No medium found" >&2; exit 1\n')
    found = probe(env=env)
    assert found.enforcement == ENFORCE_SAMPLER and "No medium found" in found.detail, found.detail
    hung = probe(timeout_s=0.5, env=_fake(tmp_path / "hung", "sleep 30\n"))
    assert hung.enforcement == ENFORCE_SAMPLER and "did not answer" in hung.detail
    # The daemon's NOTIFY_SOCKET is not passed on (systemd-run would send its ERRNO= there).
    snoop = _fake(tmp_path / "snoop", 'echo "${NOTIFY_SOCKET:-unset}" > "$(dirname "$0")/notify"; exit 1\n')
    probe(env={**snoop, "NOTIFY_SOCKET": "/run/x/notify"})
    assert (tmp_path / "snoop" / "notify").read_text() == "unset\n"
    ok = probe(env=_fake(tmp_path / "ok", ANSWERS))
    assert ok.enforcement == ENFORCE_SYSTEMD and ok.systemd_run == str(tmp_path / "ok" / "systemd-run")
    (call,) = [json.loads(line) for line in (tmp_path / "ok" / "calls").read_text().splitlines()]
    assert call[:4] == ["--user", "--scope", "--quiet", "--collect"] and call[-2:] == ["--", "true"]
    assert "MemoryMax=67108864" in call and "CPUQuota=100%" in call


def test_the_runner_reads_its_scopes_oom_kills(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text("0::/user.slice/user-1000.slice/user@1000.service/app.slice/jobsup-r.scope\n")
    assert scope_cgroup(42, str(proc)) == (
        "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/jobsup-r.scope"
    )
    (proc / "43").mkdir()
    (proc / "43" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope/x\n")
    assert scope_cgroup(43, str(proc)) is None and scope_cgroup(44, str(proc)) is None
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert oom_kills(str(cg)) == 1
    assert oom_kills(str(tmp_path / "gone")) is None


def test_a_limited_run_starts_in_a_scope_when_a_user_manager_answers(js: JobsupEnv, tmp_path: Path) -> None:
    bin_dir = js.root / "bin"
    _fake(bin_dir, ANSWERS)
    js.env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    js.start_daemon()
    repo = make_repo(tmp_path / "proj", {"README": "x\n"})
    limited = js.submit(repo, "--name", "lim", "--memory", "64M", "--cpus", "1.5", "--", "echo in-scope")
    plain = js.submit(repo, "--name", "plain", "--", "echo plain")
    js.cli("wait", limited, plain, "--timeout", "120s")
    assert js.cli("logs", limited).stdout == "in-scope\n"
    deadline = time.monotonic() + 30
    calls: list[list[str]] = []
    while time.monotonic() < deadline:
        calls = [json.loads(line) for line in (bin_dir / "calls").read_text().splitlines()]
        if len(calls) >= 2:
            break
        time.sleep(0.1)
    probe_call, run_call = calls  # the start-up probe, then the limited run only
    assert f"--unit=jobsup-{limited}" in run_call
    assert "MemoryMax=67108864" in run_call and "CPUQuota=150%" in run_call
    assert run_call[-4:-1] == ["--", "bash", "-c"] and run_call[-1] == "echo in-scope"
    admitted = [
        e
        for e in map(json.loads, js.cli("events", limited, "-o", "json").stdout.splitlines())
        if e["type"] == "Admitted"
    ]
    assert admitted[0]["data"]["limits"]["enforcement"] == "systemd-scope"
    doctor = js.cli("doctor", "-o", "json", check=False).stdout
    assert "systemd scopes" in doctor, doctor
