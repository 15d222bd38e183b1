"""Console-script entry point: the CLI plus the ``daemon`` command.

The ``daemon`` command lives outside :mod:`supervisord.client.cli` so that the CLI
package never imports the daemon (the layering import-linter enforces), and
the daemon's modules (uvicorn, starlette, the store) are imported only when
the daemon runs: every other command starts faster. ``runs``, ``show``,
``wait`` and ``logs`` in their common forms do not even import click
(:mod:`supervisord.client.cli.fast`).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Run ``jobsup``: the fast path when it takes the arguments, else
    register ``jobsup daemon`` and hand over to the click CLI."""
    from supervisord.client.cli.fast import main as fast_main

    code = fast_main(sys.argv[1:])
    if code is not None:
        sys.exit(code)

    import click

    from supervisord.client.cli.daemon_cmd import reload, restart, stop
    from supervisord.client.cli.main import cli
    from supervisord.client.cli.main import main as cli_main

    @click.group("daemon", invoke_without_command=True)
    @click.pass_context
    def _daemon(ctx: click.Context) -> None:
        """Run the daemon in the foreground (systemd runs this); `daemon
        stop|restart|reload` control the running one (runs keep running)."""
        if ctx.invoked_subcommand is not None:
            return
        from supervisord.daemon.service import run_daemon

        run_daemon()

    for command in (stop, restart, reload):
        _daemon.add_command(command)
    cli.add_command(_daemon)
    cli_main()
