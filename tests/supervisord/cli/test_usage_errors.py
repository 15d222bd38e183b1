"""Bad flags and values caught by click: one ``error:`` line naming the
flag or value and where to read more, exit 2, nothing recorded (click's own
form printed a usage line, a hint and a blank line first)."""

from __future__ import annotations

import pytest

from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["submit", "--priority", "abc", "--", "echo"], "'--priority': 'abc'"),
        (["submit", "--gpus", "-1", "--", "echo"], "'--gpus'"),
        # int() takes these; nobody means them as numbers
        (["submit", "--priority", "1_000", "--", "echo"], "'--priority': '1_000'"),
        (["submit", "--priority", "\u0663", "--", "echo"], "'--priority': '\u0663'"),
        (["submit", "--gpus", " 1", "--", "echo"], "'--gpus': ' 1'"),
        (["logs", "--tail", "1_0", "abcdef123456"], "'--tail': '1_0'"),
        (["events", "--after", "\uff11"], "'--after': '\uff11'"),
        (["submit", "--backend", "docker", "--", "echo"], "'--backend'"),
        (["logs", "--tail", "-3", "abcdef123456"], "'--tail': -3"),
        (["runs", "--phase", "FOO"], "'--phase': 'FOO'"),
        (["prune"], "'--older-than'"),
        (["submit", "--bogus"], "'--bogus'"),
        (["nosuchcommand"], "'nosuchcommand'"),
    ],
)
def test_a_bad_flag_or_value_is_one_line_exit_2(js: JobsupEnv, args: list[str], names: str) -> None:
    r = js.cli(*args, check=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and names in lines[0], lines[0]
    assert lines[0].endswith("--help`)"), lines[0]
    assert not js.state_dir.exists()  # no daemon reached, nothing recorded


def test_jobsup_alone_still_prints_its_help(js: JobsupEnv) -> None:
    r = js.cli(check=False)
    assert r.returncode == 2 and "[OPTIONS] COMMAND [ARGS]" in r.stdout + r.stderr
    assert "submit" in r.stdout + r.stderr


@pytest.mark.parametrize(
    ("args", "command"),
    [(["runs", "-o"], "runs"), (["prune", "--older-than"], "prune"), (["logs", "abcdef123456", "--tail"], "logs")],
)
def test_a_missing_option_value_points_at_that_commands_help(js: JobsupEnv, args: list[str], command: str) -> None:
    r = js.cli(*args, check=False)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "requires an argument" in r.stderr and r.stderr.rstrip().endswith(f"jobsup {command} --help`)"), r.stderr
