"""``jobsup ui``: ask the daemon to serve the web page and print its address."""

from __future__ import annotations

import os
import sys

import click

from supervisord.client.cli.output import echo, info
from supervisord.client.cli.params import WholeNumber
from supervisord.client.cli.reads import connected_client

__all__ = ["ui"]


def _has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or sys.platform == "darwin"


@click.command("ui")
@click.option("--port", type=WholeNumber(1, 65535), help="Port on 127.0.0.1 (default: ui.port, else a free one).")
@click.option("--no-open", is_flag=True, help="Print the address; do not open a browser.")
@click.option("--stop", is_flag=True, help="Stop serving the page (it stays off after a daemon restart).")
def ui(port: int | None, no_open: bool, stop: bool) -> None:
    """Serve the web page (runs, logs, events, queue) and print its address.

    The address carries a one-time token: open it once, and the browser keeps
    a session cookie. Run `jobsup ui` again for a new address."""
    client = connected_client()
    if stop:
        client.ui(stop=True)
        info("the page is off")
        return
    got = client.ui(port=port)
    url = str(got["url"])
    echo(url)
    if not no_open and _has_display():
        import webbrowser

        if not webbrowser.open(url):
            info("could not open a browser: open the address above")
