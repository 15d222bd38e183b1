"""Output that cannot be written (``jobsup runs > /dev/full``) is one
``error: cannot write output: ...`` line and exit 1, on the fast path and
on click's; a closed pipe stays quiet (tests/supervisord/test_hardening.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsupEnv]:
    """One daemon for the module, with one finished run (a table has rows)."""
    root = tmp_path_factory.mktemp("output-errors")
    with jobsup_env(root, daemon=True) as env:
        repo = make_repo(root / "proj", {"README": "x\n"})
        run_id = env.submit(repo, "--", "true")
        env.cli("wait", run_id, "--timeout", "60s")
        yield env


def _to_full(js: JobsupEnv, *args: str) -> subprocess.CompletedProcess[str]:
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "supervisord", *args],
            env=js.env,
            cwd=js.root,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "-o", "json"),  # the fast path (no click)
        ("runs", "--phase", "RUNNING", "-o", "json"),  # click's path
        ("runs",),  # a table, written line by line
        ("schema", "config"),  # click's path, no daemon needed
    ],
)
def test_a_full_disk_on_stdout_is_one_error_line(js: JobsupEnv, args: tuple[str, ...]) -> None:
    r = _to_full(js, *args)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert lines == ["error: cannot write output: No space left on device"], r.stderr


def test_the_cli_writes_stdout_only_through_its_output_module() -> None:
    """``click.echo`` to stdout and ``sys.stdout.write`` would bypass
    :func:`supervisord.client.cli.output.writing` (and the one error line)."""
    found = []
    for path in sorted((ROOT / "supervisord" / "client" / "cli").rglob("*.py")):
        if path.name in ("output.py", "mcp_server.py"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        guarded = {
            line
            for node in ast.walk(tree)
            if isinstance(node, ast.With) and any(ast.unparse(i.context_expr) == "writing()" for i in node.items)
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            f = node.func
            name = f"{getattr(f.value, 'id', '')}.{f.attr}"
            if name == "click.echo" and not any(k.arg == "err" for k in node.keywords):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: click.echo to stdout (use cli.output.echo)")
            if f.attr == "write" and ast.unparse(f.value) == "sys.stdout" and node.lineno not in guarded:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: sys.stdout.write outside `with writing()`")
    assert not found, found
