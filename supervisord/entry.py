"""Console-script entry point: the CLI plus the ``daemon`` command.

The ``daemon`` command lives outside :mod:`supervisord.cli` so that the CLI
package never imports the daemon (the layering import-linter enforces), and
the daemon's modules (uvicorn, starlette, the store) are imported only when
the daemon runs: every other command starts faster.
"""

from __future__ import annotations

import click

from supervisord.cli.main import cli
from supervisord.cli.main import main as _cli_main

__all__ = ["main"]


@click.command("daemon")
def _daemon() -> None:
    """Run the daemon in the foreground (systemd runs this)."""
    from supervisord.daemon import run_daemon

    run_daemon()


def main() -> None:
    """Run ``jobsup``: register ``jobsup daemon`` and hand over to the CLI."""
    cli.add_command(_daemon)
    _cli_main()
