"""Console-script entry point: the CLI plus the ``daemon`` command.

The ``daemon`` command lives outside :mod:`supervisord.cli` so that the CLI
package never imports the daemon (the layering import-linter enforces).
"""

from __future__ import annotations

from supervisord.cli.main import cli, main as _cli_main

__all__ = ["main"]


def main() -> None:
    """Run ``jobsup``: register ``jobsup daemon`` and hand over to the CLI."""
    from supervisord.daemon import daemon_command

    cli.add_command(daemon_command)
    _cli_main()
