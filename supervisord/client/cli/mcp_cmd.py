"""``jobsup mcp``: serve jobsup's tools to an agent over the Model Context
Protocol on stdio (see :mod:`supervisord.client.mcp.server`)."""

from __future__ import annotations

import click

__all__ = ["mcp_command"]


@click.command("mcp")
def mcp_command() -> None:
    """Serve jobsup's tools (submit, render, runs, show, logs, wait, cancel,
    events, queue, doctor, triage) as an MCP server on stdin/stdout.

    Point an MCP client at `jobsup mcp`; it talks to the daemon like the CLI
    (starting one when none answers, unless JOBSUP_NO_AUTOSTART=1).
    """
    from supervisord.client.mcp.server import serve

    serve()
