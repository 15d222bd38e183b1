"""``jobsup submit ... -- CMD`` on the CLI's fast path: the same output and
exit codes as the click path, for runs and for every kind of bad input,
without importing click or PyYAML."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from supervisord.client.cli.fast import parse
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

FAST = "from supervisord.entry import main; main()"
SLOW = "from supervisord.client.cli.main import main; main()"  # click, always


def _run(js: JobsupEnv, entry: str, args: list[str], cwd: Path) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", entry, *args], env=js.env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    # Run ids differ from one submit to the next.
    return proc.returncode, re.sub(r"\b[0-9a-f]{12}\b", "RUNID", proc.stdout), proc.stderr


def test_parses_the_common_flags() -> None:
    argv = ["submit", "--name", "t", "--env", "A=1", "--env=B=2", "--gpus", "0", "--hold", "--", "python", "x.py"]
    assert parse(argv) == (
        "submit",
        {"name": "t", "env_pairs": ["A=1", "B=2"], "gpus": 0, "hold": True, "command": ["python", "x.py"]},
        [],
    )


#: Submits whose outcome the fast path must report exactly as click does.
CASES = [
    ["--name", "ok", "--force", "--", "echo", "hi"],
    ["--name", "held", "--force", "--hold", "--priority", "5", "--label", "k=v", "--", "true"],
    ["--name", "bad name!", "--force", "--", "true"],  # --force: the first may still be in flight
    ["--timeout", "soon", "--", "true"],
    ["--env", "NOEQUALS", "--", "true"],
    ["--env", "1A=x", "--", "true"],
    ["--label", "novalue", "--", "true"],
    ["--config", "no.such.key=1", "--", "true"],
    ["--config", "missing.yaml", "--", "true"],
    ["--after", "zzzz", "--", "true"],
    ["--after", "abcdef012345", "--", "true"],
    ["--rev", "no-such-rev", "--", "true"],
    ["--memory", "lots", "--", "true"],
    ["--cpus", "many", "--", "true"],
    ["--on-done", "", "--", "true"],
    ["--", ""],
]


@pytest.mark.slow
def test_same_output_and_exit_codes_as_the_click_path(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    js.start_daemon()
    codes = []
    for args in CASES:
        assert parse(["submit", *args]) is not None, args
        got = _run(js, FAST, ["submit", *args], repo)
        assert got == _run(js, SLOW, ["submit", *args], repo), args
        codes.append(got[0])
    assert set(codes) >= {0, 2}, codes
    runs = json.loads(js.cli("runs", "--all", "-o", "json").stdout)
    assert len(runs) == 2 * codes.count(0), (codes, runs)  # nothing recorded for a refused submit
    assert sum(r["name"] == "held" and r["phase"] == "QUEUED" for r in runs) == 2, runs
    js.stop_daemon()
    args = ["submit", "--", "true"]
    got = _run(js, FAST, args, repo)
    assert got == _run(js, SLOW, args, repo) and got[0] == 69, got


@pytest.mark.parametrize(
    "args",
    [
        ["--name", "t", "--", "true"],
        ["--env", "A=1", "--label", "k=v", "--gpus", "0", "--queue", "q", "--hold", "--", "python", "x.py"],
    ],
)
def test_submit_imports_neither_click_nor_yaml(js: JobsupEnv, tmp_path: Path, args: list[str]) -> None:
    repo = make_repo(tmp_path / "repo", {"README": "x\n"})
    js.start_daemon()
    dump = tmp_path / "modules.json"
    code = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: open({str(dump)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
        "from supervisord.entry import main\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "submit", *args], env=js.env, cwd=repo, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"[0-9a-f]{12}\n", proc.stdout), proc.stdout
    loaded = json.loads(dump.read_text())
    heavy = [m for m in loaded if m.split(".")[0] in ("click", "yaml", "jsonschema", "httpx", "anyio")]
    assert not heavy, heavy
    assert "supervisord.client.cli.fast" in loaded
