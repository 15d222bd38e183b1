"""The architecture as the code really is: no import cycles, and what a CLI
command loads at run time (import-linter sees only import statements; a
package's ``__init__`` runs too, so this checks ``sys.modules``)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_cycles() -> None:
    graph = grimp.build_graph("supervisord", "store", include_external_packages=False)
    cycles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported == module:
                continue  # a C extension module counts as its package (store._accel imports its _textscan)
            if graph.find_shortest_chain(importer=imported, imported=module):
                cycles.add(tuple(sorted((module, imported))))
    assert not cycles, sorted(cycles)


#: What a `runs`, `show` or `wait` must not load.
FORBIDDEN = (
    "aiosqlite",
    "anyio",
    "uvicorn",
    "starlette",
    "kubernetes",
    "httpx",
    "jsonschema",
    "yaml",
    "structlog",
    "rich",
    "store.eventstore",
    "store.eventlog",
    "store.runqueries",
    "store.logreading",
    "store.archiving",
    "store.maintenance",
    "store._core",
    "supervisord.daemon.service",
    "supervisord.daemon.supervisor",
    "supervisord.daemon.backends",
    "supervisord.shared.config.schema",
)


@pytest.mark.parametrize("command", ["runs", "show", "wait"])
def test_cli_command_loads_nothing_of_the_daemon(command: str) -> None:
    code = (
        "import json, sys\n"
        "from supervisord.client.cli.main import cli\n"
        f"cli.get_command(None, {command!r})\n"
        "import supervisord.client.api\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    loaded = json.loads(out)
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert not bad, bad


def test_import_contracts_allow_no_indirect_imports() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    # The endpoint contract forbids direct imports only: endpoints reach the
    # store through ReadSide and Commands, which the `store` package's
    # __init__ makes an indirect import of its engine.
    direct_only = {c["name"] for c in contracts if c["name"].startswith("the API's and the page's endpoints")}
    assert len(direct_only) == 1
    assert all(not c.get("allow_indirect_imports") for c in contracts if c["name"] not in direct_only)


def test_one_version_source() -> None:
    from importlib.metadata import version

    import supervisord

    assert supervisord.__version__ == version("jobsup")
    text = "\n".join(p.read_text() for p in (ROOT / "supervisord").rglob("*.py"))
    assert '__version__ = "' not in text
