"""What jobsup takes from uvicorn stays in one module
(supervisord/api/uvicorn_server.py), and what it overrides there still
exists in the installed uvicorn (pyproject.toml bounds its version)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from supervisord.api import uvicorn_server

ROOT = Path(__file__).resolve().parents[2]


def test_only_one_module_imports_uvicorn() -> None:
    importers = []
    for path in sorted((ROOT / "supervisord").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "uvicorn" or n.startswith("uvicorn.") for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["supervisord/api/uvicorn_server.py"]


#: What supervisord/api/uvicorn_server.py overrides of uvicorn's classes.
OVERRIDES = {
    (uvicorn.Server, uvicorn_server.Server): {"__init__", "capture_signals", "startup"},
    (H11Protocol, uvicorn_server.PeerCredProtocol): {"connection_made"},
}


def test_the_overridden_methods_exist_in_the_installed_uvicorn() -> None:
    for (base, sub), names in OVERRIDES.items():
        defined = {n for n, v in vars(sub).items() if callable(v) or isinstance(v, property)}
        assert defined & set(dir(base)) == names, "an override of uvicorn not listed here"
        for name in names:
            theirs, ours = getattr(base, name), getattr(sub, name)
            assert callable(theirs), f"uvicorn's {base.__name__} has no {name} any more"
            # The same parameters: uvicorn calls ours as it would call its own.
            assert list(inspect.signature(theirs).parameters) == list(inspect.signature(ours).parameters), name
    # uvicorn.Server.serve must still go through capture_signals, or the
    # override no longer keeps the daemon's signal handlers.
    assert "capture_signals" in inspect.getsource(uvicorn.Server.serve)
    assert "self.started = True" in inspect.getsource(uvicorn.Server.startup)
