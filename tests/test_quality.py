"""Project-wide checks: the CI command, curated public APIs."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["store", "supervisord"]


# mypy --strict and lint-imports run in the lint step before the tests
# (python -m tests.ci, see tests/ci.py), not inside the suite.


def test_readme_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```sh\n")[1:]]
    quickstart_tests = blocks[1]
    assert quickstart_tests.count("\n") == 0 and quickstart_tests.endswith("python -m tests.ci")
    ci = (ROOT / ".ci" / "run").read_text()
    assert quickstart_tests.replace("pip install -e", "pip install -q -e") in ci


def _packages() -> list[str]:
    names = []
    for top in PACKAGES:
        mod = importlib.import_module(top)
        names.append(top)
        for info in pkgutil.walk_packages(mod.__path__, prefix=f"{top}."):
            if info.ispkg:
                names.append(info.name)
    return names


@pytest.mark.parametrize("name", _packages())
def test_every_package_has_a_curated_all(name: str) -> None:
    mod = importlib.import_module(name)
    exported = getattr(mod, "__all__", None)
    assert isinstance(exported, list) and exported, f"{name} needs a curated __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    for item in exported:
        assert hasattr(mod, item), f"{name}.__all__ names {item!r}, which it does not define"
        assert getattr(mod, item).__doc__ or not callable(getattr(mod, item)), f"{name}.{item} has no docstring"
