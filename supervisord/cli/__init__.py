"""The ``jobsup`` command line: click commands that talk to the daemon only
through :mod:`supervisord.api.client` (``render`` and ``config`` need no daemon).

``cli`` and ``main`` (:mod:`supervisord.cli.main`) are imported on first
use: importing this package does not import click, which the fast path
(:mod:`supervisord.cli.fast`) does without.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["cli", "main"]

if TYPE_CHECKING:
    from supervisord.cli.main import cli, main


def __getattr__(name: str) -> Any:
    if name in __all__:
        from supervisord.cli import main as _main

        return getattr(_main, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
