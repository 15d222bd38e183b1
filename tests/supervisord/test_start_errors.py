"""A daemon that cannot start says why in one ``error:`` line, never a
traceback, whether the config is wrong (exit 2) or something fails while it
starts (exit 1), even inside its task group."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = pytest.mark.timeout(120)

TWO_GPUS = "0, GPU-aaaa-0000, NVIDIA Fake, 81920 MiB\n1, GPU-bbbb-1111, NVIDIA Fake, 81920 MiB\n"


def _start(js: JobsupEnv) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=js.env, capture_output=True, text=True, timeout=60
    )


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr and "ExceptionGroup" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


@pytest.mark.gpus
def test_a_configured_gpu_the_machine_lacks_is_one_error_line(js: JobsupEnv) -> None:
    js.fake_nvidia_smi(TWO_GPUS)
    js.daemon_config("scheduler:\n  gpus: [7]\n")
    r = _start(js)
    assert r.returncode == 2, r.stderr
    assert "scheduler.gpus[0]" in _one_error_line(r) and "7" in r.stderr
    assert not (js.state_dir / "jobsup.db").exists()  # nothing started


def test_a_non_loopback_ui_host_without_tls_is_one_error_line(js: JobsupEnv) -> None:
    js.daemon_config("ui:\n  host: 0.0.0.0\n")
    r = _start(js)
    assert r.returncode == 2, r.stderr
    line = _one_error_line(r)
    assert "ui.host" in line and "tls_cert" in line
    assert not (js.state_dir / "jobsup.db").exists()


def test_an_error_inside_the_task_group_is_one_error_line(js: JobsupEnv) -> None:
    # The page's key is read once the daemon's tasks run: a truncated one
    # fails there, inside the task group.
    js.state_dir.mkdir(parents=True)
    (js.state_dir / "ui.key").write_bytes(b"short")
    r = _start(js)
    assert r.returncode == 1, r.stderr
    assert "ui.key" in _one_error_line(r) and "truncated" in r.stderr
    assert not js.socket.exists()
