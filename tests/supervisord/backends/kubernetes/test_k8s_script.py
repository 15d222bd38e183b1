"""The gated script, run for real with bash in a temp dir."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from supervisord.shared.manifest.script import STAGING_TIMEOUT_EXIT_CODE, gated_script


def _tar(path: Path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _run(script: str, workdir: Path, staging: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBSUP_SCRIPT": script, "JOBSUP_STAGING_DIR": str(staging)}
    # exactly how the manifest runs it: bash -c 'eval "$JOBSUP_SCRIPT"'
    return subprocess.run(
        ["bash", "-c", 'eval "$JOBSUP_SCRIPT"'],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_runs_the_command_in_the_extracted_tree(tmp_path: Path) -> None:
    staging, work = tmp_path / "staging", tmp_path / "work"
    staging.mkdir()
    work.mkdir()
    _tar(staging / "source.tar", {"train.py": "print('hi')\n", "data/x.txt": "payload\n"})
    (staging / "source.tar.ready").touch()
    command = 'pwd > ../where.txt\ncat data/x.txt && echo "it\'s $((1 + 2))" | tr a-z A-Z'
    proc = _run(gated_script(command, staging_timeout_s=30), work, staging)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "payload\nIT'S 3\n"
    assert (work / "where.txt").read_text().strip() == str(work / "repo")
    assert (work / "repo" / "train.py").read_text() == "print('hi')\n"


def test_waits_for_the_ready_marker_before_extracting(tmp_path: Path) -> None:
    staging, work = tmp_path / "staging", tmp_path / "work"
    staging.mkdir()
    work.mkdir()
    script = gated_script("cat msg.txt", staging_timeout_s=60)
    env = {**os.environ, "JOBSUP_SCRIPT": script, "JOBSUP_STAGING_DIR": str(staging)}
    proc = subprocess.Popen(
        ["bash", "-c", 'eval "$JOBSUP_SCRIPT"'], cwd=work, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        # The archive appears before the marker (a copy is not atomic): the
        # script must still wait for the marker.
        _tar(staging / "source.tar", {"msg.txt": "staged\n"})
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        assert not (work / "repo").exists()
        (staging / "source.tar.ready").touch()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert out == "staged\n"


def test_gives_up_after_the_staging_deadline(tmp_path: Path) -> None:
    staging, work = tmp_path / "staging", tmp_path / "work"
    staging.mkdir()
    work.mkdir()
    proc = _run(gated_script("echo never", staging_timeout_s=1), work, staging)
    assert proc.returncode == STAGING_TIMEOUT_EXIT_CODE
    assert "never" not in proc.stdout
    assert "gave up waiting for the source snapshot" in proc.stderr
    assert "within 1s" in proc.stderr
    assert str(staging / "source.tar.ready") in proc.stderr


def test_command_failure_is_the_exit_code_and_pipefail_holds(tmp_path: Path) -> None:
    staging, work = tmp_path / "staging", tmp_path / "work"
    staging.mkdir()
    work.mkdir()
    _tar(staging / "source.tar", {"a": "1\n"})
    (staging / "source.tar.ready").touch()
    proc = _run(gated_script("false | cat\necho after", staging_timeout_s=30), work, staging)
    assert proc.returncode == 1
    assert "after" not in proc.stdout
    proc = _run(gated_script("exit 7", staging_timeout_s=30), work, staging)
    assert proc.returncode == 7


def test_kubernetes_dollar_paren_form_runs_the_script_too(tmp_path: Path) -> None:
    # `bash -c "$(JOBSUP_SCRIPT)"`: Kubernetes substitutes the value into the
    # argument, so bash gets the script text itself.
    staging, work = tmp_path / "staging", tmp_path / "work"
    staging.mkdir()
    work.mkdir()
    _tar(staging / "source.tar", {"a.txt": "A\n"})
    (staging / "source.tar.ready").touch()
    script = gated_script("cat a.txt", staging_timeout_s=30)
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=work,
        env={**os.environ, "JOBSUP_STAGING_DIR": str(staging)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "A\n"


def test_bare_reference_really_does_not_run(tmp_path: Path) -> None:
    # Why lint rejects `bash -c '$JOBSUP_SCRIPT'`: bash word-splits the value
    # and runs `set` with the rest of the script as positional arguments, so
    # the command never runs and the run would even look successful (exit 0).
    script = gated_script("echo ran", staging_timeout_s=1)
    proc = subprocess.run(
        ["bash", "-c", "$JOBSUP_SCRIPT"],
        cwd=tmp_path,
        env={**os.environ, "JOBSUP_SCRIPT": script},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "ran" not in proc.stdout
    assert proc.returncode == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": "  ", "staging_timeout_s": 5},
        {"command": "x", "staging_timeout_s": 0},
        {"command": "x", "staging_timeout_s": 5, "staging_dir": "/tmp/a b"},
        {"command": "x", "staging_timeout_s": 5, "staging_dir": "relative"},
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        gated_script(**kwargs)  # type: ignore[arg-type]


def test_default_staging_dir_is_the_designed_one() -> None:
    script = gated_script("true", staging_timeout_s=90)
    assert "${JOBSUP_STAGING_DIR:-/tmp/jobsup-source}" in script
    assert script.startswith("set -euo pipefail\n")
    assert "SECONDS + 90" in script


def test_sigterm_to_the_main_process_reaches_the_whole_command(tmp_path: Path) -> None:
    # The kubelet signals only the container's PID 1 (the bash running the
    # script): the script forwards SIGTERM to the command's process group,
    # children included, waits, and exits with the command's status.
    import signal
    import time

    staging, work = tmp_path / "staging", tmp_path / "work"
    staging.mkdir()
    work.mkdir()
    _tar(staging / "source.tar", {"x": ""})
    (staging / "source.tar.ready").touch()
    command = "trap 'echo child got TERM; exit 9' TERM\necho started\nsleep 60 & wait"
    script = gated_script(command, staging_timeout_s=60)
    env = {**os.environ, "JOBSUP_SCRIPT": script, "JOBSUP_STAGING_DIR": str(staging)}
    proc = subprocess.Popen(
        ["bash", "-c", 'eval "$JOBSUP_SCRIPT"'],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n"
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)  # the main process only, as the kubelet does
        rest, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rest == "child got TERM\n"
    assert proc.returncode == 9


def test_sigterm_while_waiting_for_the_source_ends_the_script(tmp_path: Path) -> None:
    import signal
    import time

    staging, work = tmp_path / "staging", tmp_path / "work"
    staging.mkdir()
    work.mkdir()
    script = gated_script("echo never", staging_timeout_s=60)
    env = {**os.environ, "JOBSUP_SCRIPT": script, "JOBSUP_STAGING_DIR": str(staging)}
    proc = subprocess.Popen(
        ["bash", "-c", 'eval "$JOBSUP_SCRIPT"'], cwd=work, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert out == "" and proc.returncode == 143
