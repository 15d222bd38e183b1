"""The protocol's steps and the code agree: every ``crash_point("...")``
call in the product names a declared point, every declared point is called
exactly once, and the crash-point tests drive every one of them. A new
durable step must be declared (and so tested) to get its crash point."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from supervisord.daemon.crashpoints import ENV_VAR, POINTS

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


def _calls() -> Counter[str]:
    found: Counter[str] = Counter()
    for pkg in ("supervisord", "store"):
        for path in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "crash_point":
                    arg = node.args[0] if node.args else None
                    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                        f"{path}:{node.lineno}: crash_point takes the point's name as a literal"
                    )
                    found[arg.value] += 1
    return found


def test_every_crash_point_call_is_declared_and_every_point_called_once() -> None:
    calls = _calls()
    assert sorted(set(calls) - set(POINTS)) == [], "crash_point() names a step missing from crashpoints.POINTS"
    assert sorted(set(POINTS) - set(calls)) == [], "a declared step has no crash_point() call"
    assert {n: c for n, c in calls.items() if c > 1} == {}, "a step's crash point is called in two places"
    assert len(set(POINTS)) == len(POINTS)


def test_every_point_is_driven_by_a_crash_test() -> None:
    # Each declared name appears in one of the crash tests' sources.
    text = "".join(p.read_text() for p in HERE.glob("test_*.py") if p.name != Path(__file__).name)
    assert [p for p in POINTS if f'"{p}"' not in text] == []


def test_the_variable_is_ignored_unless_it_names_the_point() -> None:
    code = (
        "from supervisord.daemon.crashpoints import crash_point, POINTS\n"
        "for p in POINTS:\n"
        "    crash_point(p) if p != 'start.spawned' else None\n"
        "print('alive')\n"
        "crash_point('start.spawned')\n"
        "print('not reached')\n"
    )
    env = {**os.environ, ENV_VAR: "start.spawned"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    assert (r.returncode, r.stdout) == (-9, "alive\n")
    env.pop(ENV_VAR)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    assert (r.returncode, r.stdout) == (0, "alive\nnot reached\n")
