"""Project-wide checks: typing, layering, curated public APIs."""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["store", "supervisord"]


@pytest.mark.timeout(900)
def test_mypy_strict() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "-p", "store", "-p", "supervisord"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(300)
def test_import_layers() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a test dependency"
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


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
