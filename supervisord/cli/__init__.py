"""The ``jobsup`` command line: click commands that talk to the daemon only
through :mod:`supervisord.api.client` (``render`` and ``config`` need no daemon).
"""

from __future__ import annotations

from supervisord.cli.main import cli, main

__all__ = ["cli", "main"]
