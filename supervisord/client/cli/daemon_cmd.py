"""``jobsup daemon stop|restart|reload``: control the running daemon.

(``jobsup daemon`` alone runs the daemon in the foreground: see
:mod:`supervisord.entry`.) They talk to the daemon only through
:class:`supervisord.client.api.Client`.
"""

from __future__ import annotations

import time
from typing import Any

import click

from supervisord.client.api import Client
from supervisord.client.cli.output import echo, emit, info, output_option
from supervisord.shared.exceptions import DaemonUnreachableError

__all__ = ["reload", "restart", "stop"]

#: How long ``stop`` waits for the daemon's process to exit (its own stop
#: grace is 10 s, then the store closes).
_EXIT_WAIT_S = 60.0


def _running_daemon() -> tuple[Client, dict[str, Any]]:
    client = Client()
    info_ = client.health()
    if info_ is None:
        raise DaemonUnreachableError(f"no jobsup daemon answers on {client.paths.socket}")
    return client, info_


def _wait_gone(client: Client, pid: int) -> None:
    deadline = time.monotonic() + _EXIT_WAIT_S
    while time.monotonic() < deadline:
        if client.live_daemon_pid() != pid and client.health() is None:
            return
        time.sleep(0.1)
    raise DaemonUnreachableError(f"daemon pid {pid} did not exit within {_EXIT_WAIT_S:.0f}s")


def _stop(restart: bool) -> dict[str, Any]:
    client, health = _running_daemon()
    pid = int(health["pid"])
    doc = client.daemon_control("stop", restart=restart)
    _wait_gone(client, pid)
    return {"pid": pid, **doc}


def _runs_note(doc: dict[str, Any]) -> str:
    n = int(doc.get("supervised") or 0)
    if n == 0:
        return "no run was in flight"
    return f"{n} run{'s' if n != 1 else ''} keep{'s' if n == 1 else ''} running; the next daemon reattaches to them"


@click.command("stop")
def stop() -> None:
    """Stop the daemon. Runs keep running; the next daemon (any jobsup
    command starts one, unless JOBSUP_NO_AUTOSTART=1) reattaches to them."""
    doc = _stop(restart=False)
    echo(f"stopped the jobsup daemon (pid {doc['pid']}); {_runs_note(doc)}")
    if doc.get("systemd"):
        info("note: it ran under systemd, which does not start it again: `systemctl --user start jobsup`")


@click.command("restart")
def restart() -> None:
    """Stop the daemon and start a new one (under systemd: systemd starts
    it). Runs keep running and are reattached."""
    doc = _stop(restart=True)
    client = Client()
    if doc.get("systemd"):
        deadline = time.monotonic() + _EXIT_WAIT_S
        new = client.health()
        while new is None and time.monotonic() < deadline:
            time.sleep(0.2)
            new = client.health()
        if new is None:
            raise DaemonUnreachableError("systemd did not start the daemon again; see `systemctl --user status jobsup`")
    else:
        new = client.connect(autostart=True)
    echo(f"restarted the jobsup daemon (pid {doc['pid']} -> {new.get('pid')}); {_runs_note(doc)}")


@click.command("reload")
@output_option()
def reload(output: str) -> None:
    """Read the daemon and user config again (hooks, queues, retention,
    scheduler) and apply it, recording ConfigReloaded with what changed; an
    invalid config is refused with every error and nothing changes."""
    client, _ = _running_daemon()
    doc = client.daemon_control("reload")
    if output != "table":
        emit(doc, output)
        return
    changed = doc.get("changed") or []
    hooks = doc.get("hooks") or {}
    if not changed and not any(hooks.values()):
        echo("reloaded the config: nothing changed")
        return
    echo("reloaded the config: " + (", ".join(changed) if changed else "hooks"))
    for kind in ("added", "removed", "changed"):
        if hooks.get(kind):
            echo(f"  hooks {kind}: {', '.join(hooks[kind])}")
    for key in doc.get("restart_needed") or []:
        info(f"note: {key} takes effect at the next daemon start (`jobsup daemon restart`)")
