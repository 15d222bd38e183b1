"""The CLI's fast path (``runs``, ``show``, ``wait``, ``logs`` without
click): it parses only what it is sure of, and answers exactly as the click
path."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisord.client.cli.fast import parse
from tests.supervisord.jobsup_env import JobsupEnv, make_repo


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["runs"], ("runs", {"output": "table"}, [])),
        (["runs", "-o", "json"], ("runs", {"output": "json"}, [])),
        (["runs", "-ojson", "--all"], ("runs", {"output": "json", "all_": True}, [])),
        (["runs", "--output=yaml", "--project", "p"], ("runs", {"output": "yaml", "project": "p"}, [])),
        (["show", "abcd"], ("show", {"output": "table"}, ["abcd"])),
        (["show", "-o", "json", "abcd"], ("show", {"output": "json"}, ["abcd"])),
        (["wait", "a1", "a2", "--for", "change"], ("wait", {"output": "table", "for_": "change"}, ["a1", "a2"])),
        (
            ["wait", "a1", "--after=07", "--timeout", "5m"],
            ("wait", {"output": "table", "after": 7, "timeout": "5m"}, ["a1"]),
        ),
        (["logs", "abcd"], ("logs", {"output": "text"}, ["abcd"])),
        (["logs", "abcd", "--tail", "100"], ("logs", {"output": "text", "tail": 100}, ["abcd"])),
        (["logs", "--tail=0", "abcd", "-f"], ("logs", {"output": "text", "tail": 0, "follow": True}, ["abcd"])),
        (["logs", "-o", "json", "abcd"], ("logs", {"output": "json"}, ["abcd"])),
        (
            ["logs", "abcd", "--follow", "--output=json", "--tail", "007"],
            ("logs", {"output": "json", "follow": True, "tail": 7}, ["abcd"]),
        ),
        (["logs", "-otext", "abcd"], ("logs", {"output": "text"}, ["abcd"])),
    ],
)
def test_parses_the_common_forms(argv: list[str], expected: object) -> None:
    assert parse(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["submit", "true"],  # a task file: YAML, left to click
        ["submit", "-f", "--", "true"],
        ["events", "abcd"],
        ["runs", "--help"],
        ["runs", "-h"],
        ["show", "abcd", "--help"],
        ["runs", "--phase", "running"],  # click checks the choice
        ["runs", "-o", "xml"],
        ["runs", "-o"],
        ["runs", "-o", "-x"],
        ["runs", "--all=1"],
        ["runs", "extra"],
        ["runs", "-o", "json", "-o", "yaml"],
        ["show"],
        ["show", "a", "b"],
        ["show", "--", "abcd"],
        ["show", "-"],
        ["wait"],
        ["wait", "a1", "--after", "-1"],
        ["wait", "a1", "--after", "x"],
        ["wait", "a1", "--after", "\u0663"],  # a digit, but not ASCII
        ["wait", "a1", "--bogus"],
        ["show", "ab\udcffcd"],  # not UTF-8: the click path's main reports it
        ["runs", "-o", "text"],  # logs' choice, not runs'
        ["show", "abcd", "-o", "text"],
        ["logs"],
        ["logs", "a", "b"],
        ["logs", "a", "--help"],
        ["logs", "a", "-o", "table"],  # the other commands' choices, not logs'
        ["logs", "a", "-o", "yaml"],
        ["logs", "a", "-o", "JSON"],
        ["logs", "a", "--tail"],
        ["logs", "a", "--tail="],
        ["logs", "a", "--tail", "-1"],
        ["logs", "a", "--tail", "x"],
        ["logs", "a", "--tail", "+5"],  # click's int() takes these: click decides
        ["logs", "a", "--tail", " 5"],
        ["logs", "a", "--tail", "1_000"],
        ["logs", "a", "--tail", "\u0663"],
        ["logs", "a", "--tail", "1", "--tail", "2"],
        ["logs", "a", "-f", "-f"],
        ["logs", "a", "--follow=1"],
        ["logs", "a", "-fo", "json"],  # combined short flags
        ["logs", "a", "-of"],
        ["logs", "a", "--after", "3"],
        ["logs", "--", "a"],
        ["logs", "-"],
        ["logs", "ab\udcffcd"],
    ],
)
def test_leaves_everything_else_to_click(argv: list[str]) -> None:
    assert parse(argv) is None


def _run(js: JobsupEnv, entry: str, args: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", entry, *args], env=js.env, cwd=js.root, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_same_output_and_exit_codes_as_the_click_path(js: JobsupEnv, tmp_path: Path) -> None:
    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    ok = js.submit(repo, "--name", "ok", "--env", "TOKEN=s3cret", "--", "echo hi")
    bad = js.submit(repo, "--name", "bad", "--", "exit 3")
    chatty = js.submit(repo, "--name", "chatty", "--", CHATTY)
    for run in (ok, bad, chatty):
        js.cli("wait", run, check=False)
    fast = "from supervisord.entry import main; main()"
    slow = "from supervisord.client.cli.main import main; main()"  # click, always
    cases = [
        ["runs"],
        ["runs", "-o", "json"],
        ["runs", "--all", "-o", "yaml"],
        ["runs", "--project", "nope"],
        ["show", ok],
        ["show", bad[:6]],
        ["show", ok, "-o", "json"],
        ["show", "zzzz"],
        ["show", "0000"],
        ["wait", ok],
        ["wait", bad, "-o", "json"],
        ["wait", ok, bad],
        ["wait", ok, "--for", "RUNNING"],
        ["wait", ok, "--for", "CANCELED"],
        ["wait", ok, "--timeout", "0s"],
        ["wait", ok, "--for", "nonsense"],
        ["wait", "zzzz"],
        *LOGS_CASES(chatty),
        ["logs", bad[:6], "-f"],
        ["logs", ok, "-o", "json", "--tail", "5"],
    ]
    codes = set()
    for args in cases:
        got = _run(js, fast, args)
        assert got == _run(js, slow, args), args
        codes.add(got[0])
    assert codes >= {0, 1, 2, 5}, codes
    assert "s3cret" not in json.dumps(_run(js, fast, ["show", ok]))
    text = _run(js, fast, ["logs", chatty])
    lines = text[1].splitlines()
    assert text[0] == 0 and sorted(lines) == sorted(CHATTY_LINES), text
    as_json = [
        json.loads(line) for line in _run(js, fast, ["logs", chatty, "-o", "json", "--tail", "2"])[1].splitlines()
    ]
    assert [(o["line_no"], o["text"]) for o in as_json] == [(4, lines[3]), (5, lines[4])], as_json
    assert _run(js, fast, ["logs", "0000"])[0] == 2
    js.stop_daemon()
    for args in (["runs"], ["logs", chatty], ["logs", chatty, "-f", "--tail", "1"], ["logs", chatty, "-o", "json"]):
        got = _run(js, fast, args)
        assert got == _run(js, slow, args), args
        assert got[0] == 69 and got[1] == "", (args, got)


#: Read and write commands given malformed run ids (not 4 to 12 hex).
MALFORMED_ID_CASES = [
    ["show", "abc"],
    ["show", "zzzz"],
    ["show", "-o", "json", "abcdef0123456"],
    ["wait", "abc"],
    ["wait", "abcd", "zzzz", "--timeout", "5s"],
    ["logs", "zzzz"],
    ["logs", "zzzz", "-f", "--tail", "1"],
    ["cancel", "abc"],
    ["hold", "zzzz"],
    ["release", "g123"],
    ["rerun", "abc"],
    ["events", "zzzz"],
]


@pytest.mark.parametrize("args", MALFORMED_ID_CASES, ids=" ".join)
def test_a_malformed_run_id_is_rejected_before_connecting(js: JobsupEnv, args: list[str]) -> None:
    # No daemon and no autostart: the id is checked first, exit 2 with the
    # daemon's own message (not 69), on the fast path and on click's.
    fast = "from supervisord.entry import main; main()"
    slow = "from supervisord.client.cli.main import main; main()"
    got = _run(js, fast, args)
    assert got == _run(js, slow, args), args
    code, out, err = got
    bad = next(a for a in args[1:] if a in ("abc", "zzzz", "abcdef0123456", "g123"))
    assert code == 2 and out == "", got
    assert f"error: run id {bad!r}: give the 12-hex-character run id or a unique prefix of 4+ characters" in err, err
    assert "daemon" not in err, err


@pytest.mark.parametrize("args", [["show", "abcd"], ["wait", "ABCDEF012345"], ["logs", "0000"], ["cancel", "abcd"]])
def test_a_well_formed_unknown_id_without_daemon_is_still_69(js: JobsupEnv, args: list[str]) -> None:
    fast = "from supervisord.entry import main; main()"
    slow = "from supervisord.client.cli.main import main; main()"
    got = _run(js, fast, args)
    assert got == _run(js, slow, args), args
    assert got[0] == 69 and "no jobsup daemon answers" in got[2], got


#: A job whose log has lines on both streams, non-ASCII text and characters
#: JSON escapes; :data:`CHATTY_LINES` are its lines (the stderr one may come
#: anywhere: the two pipes are read apart).
CHATTY = "printf 'one\\n'; printf 'deux \\303\\251t\\303\\251\\n'; echo warn >&2; printf 'tab\\there \\\\ \"q\"\\n'; echo last"
CHATTY_LINES = ["one", "deux \u00e9t\u00e9", "warn", 'tab\there \\ "q"', "last"]


def LOGS_CASES(run: str) -> list[list[str]]:  # noqa: N802 - a table
    """``jobsup logs`` forms compared between the two paths for ``run``."""
    return [
        ["logs", run],
        ["logs", run[:6]],
        ["logs", run, "--tail", "2"],
        ["logs", run, "--tail", "0"],
        ["logs", run, "--tail=100"],
        ["logs", run, "-o", "json"],
        ["logs", run, "-o", "json", "--tail", "1"],
        ["logs", run, "-f"],
        ["logs", "-f", run, "--tail", "3"],
        ["logs", run, "--follow", "-o", "json", "--tail", "2"],
        ["logs", run, "--tail", "-1"],  # click reports these
        ["logs", run, "-o", "yaml"],
        ["logs", run, "--tail", "+2"],
        ["logs", "zzzz"],  # exit 2: no such run
        ["logs", "0000"],
        ["logs", "0000", "-f"],
        ["logs", "0000", "-o", "json"],
        ["logs", "0000", "--tail", "3"],
    ]


def test_logs_of_an_archived_run_same_on_both_paths(js: JobsupEnv, tmp_path: Path) -> None:
    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    run = js.submit(repo, "--", CHATTY)
    js.cli("wait", run)
    fast = "from supervisord.entry import main; main()"
    slow = "from supervisord.client.cli.main import main; main()"
    js.cli("prune", "--older-than", "0s")
    archive = js.state_dir / "archive" / f"{run}.jslog"
    assert archive.is_file()
    for args in LOGS_CASES(run):
        assert _run(js, fast, args) == _run(js, slow, args), args
    assert sorted(_run(js, fast, ["logs", run])[1].splitlines()) == sorted(CHATTY_LINES)
    # A changed archive: one error line and exit 1 on both paths, no text.
    raw = bytearray(archive.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    archive.write_bytes(bytes(raw))
    for args in (["logs", run], ["logs", run, "--tail", "1"], ["logs", run, "-o", "json"], ["logs", run, "-f"]):
        got = _run(js, fast, args)
        assert got == _run(js, slow, args), args
        assert got[0] == 1 and got[1] == "" and got[2].startswith("error: ") and got[2].count("\n") == 1, got


@pytest.mark.parametrize("args", [[], ["-o", "json"], ["-f"], ["--tail", "150000"], ["-f", "-o", "json"]])
def test_logs_into_a_closed_pipe_exits_quietly(js: JobsupEnv, tmp_path: Path, args: list[str]) -> None:
    """``jobsup logs RUN | head -1``: more than a pipe holds, the reader goes
    away after one line; exit 0 with nothing on stderr, on both paths, also
    with ``PYTHONUNBUFFERED`` (where stdout's binary layer is a raw file
    that may take part of a write: no error then would be output lost)."""
    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    run = js.submit(repo, "--", "seq 1 200000")
    js.cli("wait", run)
    plain = {k: v for k, v in js.env.items() if k != "PYTHONUNBUFFERED"}
    for env in (plain, {**plain, "PYTHONUNBUFFERED": "1"}):
        results = []
        for entry in (
            "from supervisord.entry import main; main()",
            "from supervisord.client.cli.main import main; main()",
        ):
            proc = subprocess.Popen(
                [sys.executable, "-c", entry, "logs", run, *args],
                env=env,
                cwd=js.root,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdout is not None and proc.stderr is not None
            first = proc.stdout.readline()
            proc.stdout.close()
            err = proc.stderr.read()
            results.append((proc.wait(timeout=120), err, first))
        assert results[0] == results[1], env.get("PYTHONUNBUFFERED")
        code, err, first = results[0]
        assert code == 0 and err == b"", (env.get("PYTHONUNBUFFERED"), results[0])
        expected = "50001" if "--tail" in args else "1"
        assert (json.loads(first)["text"] if "json" in args else first.decode().rstrip("\n")) == expected


def test_ctrl_c_while_following_is_130_on_both_paths(js: JobsupEnv, tmp_path: Path) -> None:
    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    run = js.submit(repo, "--", "echo started; sleep 600")
    results = []
    try:
        for entry in (
            "from supervisord.entry import main; main()",
            "from supervisord.client.cli.main import main; main()",
        ):
            proc = subprocess.Popen(
                [sys.executable, "-c", entry, "logs", "-f", run],
                env=js.env,
                cwd=js.root,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"started\n"
            time.sleep(0.2)  # into the wait for more lines (either way it must be 130)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            results.append((proc.returncode, out, err))
    finally:
        js.cli("cancel", run, check=False)
    assert results[0] == results[1]
    assert results[0] == (130, b"", b"\naborted\n"), results[0]


#: What ``jobsup runs``, ``show``, ``wait`` and ``logs`` must not import: the click
#: CLI, YAML, the standard library's HTTP client (it imports ssl and the
#: email parser), what only starting a daemon needs, and everything of the
#: daemon side. A cost guard without a clock (bench/cli_latency.py has the
#: figures).
HEAVY = (
    "click",
    "yaml",
    "rich",
    "http",
    "ssl",
    "email",
    "subprocess",
    "dataclasses",
    "inspect",
    "secrets",
    "aiosqlite",
    "anyio",
    "uvicorn",
    "starlette",
    "kubernetes",
    "httpx",
    "jsonschema",
    "jinja2",
    "structlog",
    "platformdirs",
    "store",
    "supervisord.shared.config",
    "supervisord.daemon.hooks",
    "supervisord.shared.task",
    "supervisord.daemon.service",
    "supervisord.daemon.supervisor",
    "supervisord.daemon.backends",
)


def test_read_commands_import_nothing_heavy(js: JobsupEnv, tmp_path: Path) -> None:
    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    run = js.submit(repo, "--", "echo one; echo two")
    js.cli("wait", run)
    dump = tmp_path / "modules.json"
    code = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: open({str(dump)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
        "from supervisord.entry import main\n"
        "main()\n"
    )
    for args in (
        ["runs", "-o", "json"],
        ["show", run],
        ["wait", run],
        ["runs"],
        ["wait", run, "-o", "json"],
        ["logs", run],
        ["logs", run, "--tail", "1"],
        ["logs", run, "-o", "json"],
        ["logs", run, "-f", "--tail", "1"],
        ["logs", run, "-f", "-o", "json"],
    ):
        proc = subprocess.run([sys.executable, "-c", code, *args], env=js.env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        loaded = json.loads(dump.read_text())
        heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
        assert not heavy, (args, heavy)
        assert "supervisord.client.cli.fast" in loaded, args
