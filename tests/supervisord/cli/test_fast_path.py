"""The CLI's fast path (``runs``, ``show``, ``wait`` without click): it
parses only what it is sure of, and answers exactly as the click path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisord.cli.fast import parse
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
    ],
)
def test_parses_the_common_forms(argv: list[str], expected: object) -> None:
    assert parse(argv) == expected


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["submit", "--", "true"],
        ["logs", "abcd"],
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
    for run in (ok, bad):
        js.cli("wait", run, check=False)
    fast = "from supervisord.entry import main; main()"
    slow = "from supervisord.cli.main import main; main()"  # click, always
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
    ]
    codes = set()
    for args in cases:
        got = _run(js, fast, args)
        assert got == _run(js, slow, args), args
        codes.add(got[0])
    assert codes >= {0, 1, 2, 5}, codes
    assert "s3cret" not in json.dumps(_run(js, fast, ["show", ok]))
    js.stop_daemon()
    assert _run(js, fast, ["runs"]) == _run(js, slow, ["runs"])
    assert _run(js, fast, ["runs"])[0] == 69


#: What ``jobsup runs``, ``show`` and ``wait`` must not import: the click
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
    "supervisord.config",
    "supervisord.hooks",
    "supervisord.task",
    "supervisord.daemon",
    "supervisord.supervisor",
    "supervisord.backends",
)


def test_read_commands_import_nothing_heavy(js: JobsupEnv, tmp_path: Path) -> None:
    js.start_daemon()
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    run = js.submit(repo, "--", "true")
    js.cli("wait", run)
    dump = tmp_path / "modules.json"
    code = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: open({str(dump)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
        "from supervisord.entry import main\n"
        "main()\n"
    )
    for args in (["runs", "-o", "json"], ["show", run], ["wait", run], ["runs"], ["wait", run, "-o", "json"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], env=js.env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        loaded = json.loads(dump.read_text())
        heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
        assert not heavy, (args, heavy)
        assert "supervisord.cli.fast" in loaded, args
