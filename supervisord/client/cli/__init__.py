"""The ``jobsup`` command line: click commands that talk to the daemon only
through :mod:`supervisord.client.api` (``render`` and ``config`` need no daemon).

The root group ``cli`` (:mod:`supervisord.client.cli.main`, whose ``main`` is the
console script's CLI half) is imported on first use: importing this package
does not import click, which the fast path (:mod:`supervisord.client.cli.fast`)
does without.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["cli"]

if TYPE_CHECKING:
    from supervisord.client.cli.main import cli


def __getattr__(name: str) -> Any:
    if name == "cli":
        return importlib.import_module("supervisord.client.cli.main").cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
