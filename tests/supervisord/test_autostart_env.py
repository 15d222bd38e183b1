"""An autostarted daemon gets a clean environment (supervisord.client.daemonenv):
the first shell's variables never reach ``/proc/<daemon>/environ``, while
what the daemon needs (PATH, HOME, XDG_*, JOBSUP_*) does, and local runs
still get the submitting shell's environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from supervisord.client.daemonenv import daemon_env
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

MARKER = "marker-5ecret-a7c1e9"


def test_daemon_env_keeps_only_what_the_daemon_needs() -> None:
    shell = {
        "PATH": "/p",
        "HOME": "/h",
        "XDG_STATE_HOME": "/s",
        "JOBSUP_SOCKET": "/x.sock",
        "LC_ALL": "C.UTF-8",
        "KUBECONFIG": "/k",
        "https_proxy": "http://proxy:3128",
        "AWS_SECRET_ACCESS_KEY": MARKER,
        "MY_TOKEN": MARKER,
        "CUDA_VISIBLE_DEVICES": "0",
        "CONDA_PREFIX": "/conda",
        "PYTHONSTARTUP": "/evil.py",
    }
    assert daemon_env(shell) == {
        "PATH": "/p",
        "HOME": "/h",
        "XDG_STATE_HOME": "/s",
        "JOBSUP_SOCKET": "/x.sock",
        "LC_ALL": "C.UTF-8",
        "KUBECONFIG": "/k",
        "https_proxy": "http://proxy:3128",
        "PYTHONUNBUFFERED": "1",
    }


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def test_an_autostarted_daemon_does_not_inherit_the_first_shells_variables(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"README": "x\n"})
    env = {k: v for k, v in js.env.items() if k != "JOBSUP_NO_AUTOSTART"}
    env["MY_SECRET_TOKEN"] = MARKER
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "submit", "--name", "env", "--", "echo token=$MY_SECRET_TOKEN"],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    assert "started jobsup daemon" in r.stderr
    run_id = r.stdout.strip()
    pid = int((js.state_dir / "daemon.lock").read_text().strip())
    try:
        seen = _environ(pid)
        assert MARKER not in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        assert "MY_SECRET_TOKEN" not in seen
        for kept in ("PATH", "JOBSUP_STATE_DIR", "JOBSUP_SOCKET", "XDG_CONFIG_HOME"):
            assert seen.get(kept) == env[kept], kept
        # The run still starts from the submitting shell's environment.
        w = js.cli("wait", run_id, "--timeout", "60s", check=False)
        assert w.returncode == 0, w.stderr
        assert js.cli("logs", run_id).stdout.strip() == f"token={MARKER}"
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while js.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
