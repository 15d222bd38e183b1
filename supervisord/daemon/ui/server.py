"""Serving the web page from the daemon: a uvicorn server on TCP that
``jobsup ui`` switches on, beside the Unix-socket API.

The page is off until asked for. Once asked, the daemon remembers it in
``<state dir>/ui.json`` (0600: ``{"port": P}``) and serves it again after a
restart on the same port, so an open page resumes its live streams; ``jobsup
ui --stop`` switches it off and forgets it.

Where it listens: 127.0.0.1, unless the daemon config sets ``ui.host``. A
non-loopback host needs ``ui.tls_cert`` and ``ui.tls_key`` (the session
cookie would otherwise cross the network in clear text); without them the
request is refused with :class:`UiConfigError`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import structlog

from store import EventStore
from supervisord.daemon.api.streams import StreamCloser
from supervisord.daemon.api.uvicorn_server import Config, Server
from supervisord.daemon.ui.app import UiActions, create_ui_app
from supervisord.daemon.ui.auth import UiAuth, load_ui_key
from supervisord.shared.exceptions import UiConfigError, UsageError

__all__ = ["UiConfigError", "UiServer", "check_ui_settings"]

log = structlog.get_logger("jobsup.ui")


def check_ui_settings(settings: Mapping[str, Any]) -> None:
    """Check the daemon config's ``ui`` section (``host``, ``tls_cert``,
    ``tls_key``) before anything is served: the daemon calls it with the
    rest of its config, before it starts. Raises UiConfigError naming
    ``ui.host`` when a non-loopback host has no TLS certificate and key."""
    host = str(settings.get("host") or "127.0.0.1")
    if not _is_loopback(host) and not (settings.get("tls_cert") and settings.get("tls_key")):
        raise UiConfigError(
            f"daemon config ui.host {host!r} is not a loopback address: "
            "set ui.tls_cert and ui.tls_key to serve the page there, or leave ui.host unset"
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UiServer:
    """The page's server. ``serve()`` runs for the daemon's life (start it in
    the daemon's task group); :meth:`enable` starts listening and returns the
    URL with a fresh one-time token; :meth:`disable` stops."""

    def __init__(
        self,
        *,
        store: EventStore,
        actions: UiActions,
        state_dir: Path,
        settings: Mapping[str, Any],
        streams: StreamCloser | None = None,
    ) -> None:
        self._state_file = state_dir / "ui.json"
        self._auth = UiAuth(load_ui_key(state_dir))
        self._host = str(settings.get("host") or "127.0.0.1")
        self._default_port = int(settings.get("port") or 0)
        self._tls = (settings.get("tls_cert"), settings.get("tls_key"))
        check_ui_settings(settings)
        self._port = 0
        self._server: Server | None = None
        self._requests: anyio.abc.ObjectSendStream[tuple[int, anyio.Event]]
        self._requests, self._incoming = anyio.create_memory_object_stream[tuple[int, anyio.Event]](8)
        self._app = create_ui_app(
            store=store, actions=actions, auth=self._auth, allowed_hosts=self._hosts,
            secure_cookie=all(self._tls), streams=streams,
        )  # fmt: skip
        self._errors: list[str] = []

    def _hosts(self) -> set[str]:
        port = self._port
        names = {self._host, "127.0.0.1", "localhost"} if _is_loopback(self._host) else {self._host}
        return {f"{n}:{port}" for n in names} | ({f"[::1]:{port}"} if _is_loopback(self._host) else set())

    @property
    def port(self) -> int | None:
        """The port served on, or None when the page is off."""
        return self._port if self._server is not None else None

    def url(self, token: str | None = None) -> str:
        """The page's address (with ``?token=`` when given)."""
        scheme = "https" if all(self._tls) else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self._port}/" + (f"?token={token}" if token else "")

    def remembered_port(self) -> int | None:
        """The port a previous daemon served on (``ui.json``), if any."""
        try:
            data = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("ui state unreadable; the page stays off", path=str(self._state_file), error=str(err))
            return None
        port = data.get("port") if isinstance(data, dict) else None
        return port if isinstance(port, int) and 0 < port < 65536 else None

    async def enable(self, port: int | None = None) -> dict[str, Any]:
        """Serve the page (if not yet) and return ``{"url", "port"}`` with a
        new one-time token in the URL. ``port`` None: the one served, the
        config's ``ui.port``, or a free one. Raises UsageError when the port
        cannot be bound or differs from the one already served."""
        wanted = port if port is not None else (self._port or self._default_port)
        if self._server is None:
            done = anyio.Event()
            await self._requests.send((wanted, done))
            with anyio.fail_after(30):
                await done.wait()
            if self._server is None:
                raise UsageError(self._errors.pop() if self._errors else "the page could not be started")
        elif port is not None and port != self._port:
            raise UsageError(
                f"--port {port}: the page is already served on port {self._port}; run `jobsup ui --stop` first"
            )
        return {"url": self.url(self._auth.new_token()), "port": self._port}

    def shutdown(self) -> None:
        """Stop serving (the daemon is stopping); the page stays remembered."""
        if self._server is not None:
            self._server.should_exit = True

    async def disable(self) -> None:
        """Stop serving and forget the page (it stays off after a restart)."""
        self._state_file.unlink(missing_ok=True)
        if self._server is not None:
            self._server.should_exit = True

    async def serve(self) -> None:
        """Serve requests to enable the page, for the daemon's life. Starts at
        once on the remembered port when a previous daemon served one."""
        remembered = self.remembered_port()
        async with anyio.create_task_group() as tg:
            if remembered is not None:
                ready = anyio.Event()
                tg.start_soon(self._run, remembered, ready)
                await ready.wait()
            async for wanted, done in self._incoming:
                if self._server is not None:
                    done.set()
                    continue
                tg.start_soon(self._run, wanted, done)

    def _bind(self, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, port))
        except OSError as err:
            sock.close()
            raise UsageError(f"the page cannot listen on {self._host}:{port}: {err.strerror}") from None
        sock.listen(128)
        sock.setblocking(False)
        return sock

    async def _run(self, port: int, started: anyio.Event) -> None:
        try:
            sock = self._bind(port)
        except UsageError as err:
            log.warning("ui not started", error=str(err))
            self._errors.append(str(err))
            started.set()
            return
        self._port = int(sock.getsockname()[1])
        config = Config(
            self._app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=1,
            ssl_certfile=self._tls[0] or None, ssl_keyfile=self._tls[1] or None,
        )  # fmt: skip
        server = Server(config)
        self._server = server
        tmp = self._state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"port": self._port}, f)
        os.replace(tmp, self._state_file)
        log.info("ui serving", url=self.url())
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve, [sock])
                with anyio.fail_after(30):
                    await server.ready.wait()
                started.set()
        finally:
            started.set()
            sock.close()
            self._server = None
            log.info("ui stopped")
