"""A closed stdout pipe (``jobsup events | head -1``) is not an error of
jobsup: no message, no traceback, and the command's own exit status
(README, "Commands"), on the fast path and the click path alike, with and
without ``PYTHONUNBUFFERED``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo

pytestmark = pytest.mark.timeout(600)

FAST = "from supervisord.entry import main; main()"
SLOW = "from supervisord.client.cli.main import main; main()"  # click, always


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsupEnv]:
    """One daemon for the module."""
    with jobsup_env(tmp_path_factory.mktemp("pipe"), daemon=True) as env:
        yield env


@pytest.fixture(scope="module")
def runs(js: JobsupEnv) -> dict[str, str]:
    """``ok`` (completed, 2,000 lines), ``bad`` (exit 3): both ended."""
    repo = make_repo(js.root / "proj", {"README": "x\n"})
    ok = js.submit(repo, "--name", "ok", "--", "seq 1 2000")
    bad = js.submit(repo, "--name", "bad", "--", "echo oops; exit 3")
    js.cli("wait", ok, bad, check=False)
    return {"ok": ok, "bad": bad, "repo": str(repo)}


def _into_closed_pipe(js: JobsupEnv, entry: str, args: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run the CLI with a stdout whose reader closed before it wrote
    anything (so every write fails with EPIPE, whatever the output's size);
    its exit code and stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", entry, *args],
            env=env,
            cwd=js.root,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    finally:
        os.close(write_end)
    return proc.returncode, proc.stderr


def _envs(js: JobsupEnv) -> list[dict[str, str]]:
    plain = {k: v for k, v in js.env.items() if k != "PYTHONUNBUFFERED"}
    return [plain, {**plain, "PYTHONUNBUFFERED": "1"}]


def test_reads_into_a_closed_pipe_exit_0_quietly(js: JobsupEnv, runs: dict[str, str]) -> None:
    ok = runs["ok"]
    cases = [
        ["events"],
        ["events", "-o", "json"],
        ["events", "-o", "yaml"],
        ["events", ok],
        ["runs"],
        ["runs", "--all", "-o", "json"],
        ["show", ok],
        ["show", ok, "-o", "yaml"],
        ["logs", ok],
        ["logs", ok, "-o", "json"],
        ["logs", ok, "-f"],
        ["logs", ok, "--tail", "5"],
        ["queue", "-o", "json"],
        ["schema"],
    ]
    for env in _envs(js):
        for args in cases:
            for entry in (FAST, SLOW):
                got = _into_closed_pipe(js, entry, args, env)
                assert got == (0, b""), (args, entry, env.get("PYTHONUNBUFFERED"), got)


def test_wait_and_submit_follow_keep_their_outcome_code(js: JobsupEnv, runs: dict[str, str]) -> None:
    """Their exit status says how the runs ended: a closed stdout does not
    turn a COMPLETED run into 1 (ERROR), nor an ERROR into 0."""
    ok, bad = runs["ok"], runs["bad"]
    for env in _envs(js):
        for entry in (FAST, SLOW):
            code, err = _into_closed_pipe(js, entry, ["wait", ok, "-o", "json"], env)
            assert (code, err.decode()) == (0, f"run {ok}: COMPLETED\n"), entry
            code, err = _into_closed_pipe(js, entry, ["wait", bad, "-o", "json"], env)
            assert (code, err.decode()) == (1, f"run {bad}: ERROR (NonZeroExit)\n"), entry
    repo = Path(runs["repo"])
    for command, expected in (("seq 1 3000", 0), ("seq 1 3000; exit 3", 1)):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "supervisord", "submit", "--force", "--follow", "--", command],
                env=js.env,
                cwd=repo,
                stdout=write_end,
                stderr=subprocess.PIPE,
                timeout=120,
                text=True,
            )
        finally:
            os.close(write_end)
        assert proc.returncode == expected, (command, proc.stderr)
        assert "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["events", "-f"], ["logs", "-f"]])
def test_following_ends_when_the_reader_goes_while_nothing_comes(
    js: JobsupEnv, runs: dict[str, str], args: list[str]
) -> None:
    """``jobsup events -f | head -1`` with nothing new to print: ends once
    ``head`` has (on the next heartbeat), not at the next event."""
    repo = Path(runs["repo"])
    quiet = js.submit(repo, "--force", "--name", "quiet", "--", "echo started; sleep 600")
    try:
        for entry in (FAST, SLOW):
            proc = subprocess.Popen(
                [sys.executable, "-c", entry, args[0], quiet, *args[1:]],
                env=js.env,
                cwd=js.root,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline()
            proc.stdout.close()
            try:
                code = proc.wait(timeout=90)
            finally:
                proc.kill()
            assert (code, proc.stderr.read()) == (0, b""), entry
    finally:
        js.cli("cancel", quiet, check=False)
