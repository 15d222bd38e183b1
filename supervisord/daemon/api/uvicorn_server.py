"""Everything jobsup takes from uvicorn, in one module: the daemon's API on
its Unix socket and the web page on TCP are both served by :class:`Server`
with a :class:`Config`; the API's connections use :class:`PeerCredProtocol`.

Subclassing reaches into uvicorn's own methods (``Server.capture_signals``,
``Server.main_loop``, ``Server.should_exit``, ``H11Protocol.connection_made``),
which are not a documented API: this is
the one place to check when uvicorn changes, and pyproject.toml bounds
uvicorn to the versions checked here (tests/supervisord/test_uvicorn_server.py
fails when a method overridden here no longer exists).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any, Final

import anyio
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["PEER_SCOPE_KEY", "Config", "FreshDateProtocol", "PeerCredProtocol", "Server"]

log = structlog.get_logger("jobsup.api")

#: uvicorn's server settings (re-exported: callers import nothing of uvicorn).
Config = uvicorn.Config

#: The ASGI scope key holding the peer's ``{"uid", "pid"}`` (SO_PEERCRED).
PEER_SCOPE_KEY = "jobsup.peer"

#: Seconds between two passes of the server's main loop while a connection
#: is open (each pass refreshes the ``Date`` header, as uvicorn's does every
#: 10th 0.1 s tick)...
BUSY_TICK_S: Final = 1.0
#: ...and while none is (a new connection refreshes the header itself).
IDLE_TICK_S: Final = 60.0


class Server(uvicorn.Server):
    """uvicorn's server without its own signal handling: the daemon owns
    SIGTERM and SIGINT (anyio's signal receiver) and stops each server with
    :meth:`stop_listening`. uvicorn's ``serve`` wraps itself in
    ``capture_signals``, which would replace the daemon's handlers with
    ``signal.signal`` while the server runs and raise the signal again when it
    ends; here it does nothing. :attr:`ready` is set once it listens (create
    the server on the event loop)."""

    def __init__(self, config: Config) -> None:
        self._exit_requested = anyio.Event()  # before uvicorn's __init__ sets should_exit
        super().__init__(config)
        #: Set once the server listens (uvicorn's ``started``).
        self.ready = anyio.Event()
        if config.http in ("auto", "h11"):  # no httptools here: "auto" is h11
            config.http = FreshDateProtocol

    @property
    def should_exit(self) -> bool:
        """uvicorn's flag; setting it True wakes :meth:`main_loop` at once."""
        return self._exit_requested.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit_requested.set()
        elif self._exit_requested.is_set():
            self._exit_requested = anyio.Event()

    async def main_loop(self) -> None:
        """uvicorn's loop wakes every 0.1 s to look at ``should_exit`` (and
        refreshes the ``Date`` header every 10th time): ten wake-ups a second
        of an idle daemon. This one sleeps until ``should_exit`` is set, waking
        every :data:`BUSY_TICK_S` while connections are open (the ``Date``
        header) and every :data:`IDLE_TICK_S` otherwise."""
        while not await self.on_tick(0):  # counter 0: a pass that refreshes the headers
            tick = BUSY_TICK_S if self.server_state.connections else IDLE_TICK_S
            with anyio.move_on_after(tick):
                await self._exit_requested.wait()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.ready.set()

    def stop_listening(self) -> None:
        """Close the listeners now (no new connection is accepted from here
        on) and ask the server to exit: uvicorn then lets the open requests
        finish (``timeout_graceful_shutdown``)."""
        self.should_exit = True
        for listener in getattr(self, "servers", []):
            listener.close()


class FreshDateProtocol(H11Protocol):
    """uvicorn's h11 protocol, refreshing the server's ``Date`` header as a
    connection opens: :meth:`Server.main_loop` does so only every
    :data:`BUSY_TICK_S` while connections are open, and a connection made
    after a long idle spell would otherwise answer with an old date."""

    def connection_made(self, transport: Any) -> None:
        _refresh_default_headers(self.server_state, self.config)
        super().connection_made(transport)


def _refresh_default_headers(state: Any, config: Config) -> None:
    """What uvicorn's ``on_tick`` sets once a second: the ``Date`` header
    (when ``config.date_header``) and the configured headers."""
    date = [(b"date", formatdate(time.time(), usegmt=True).encode())] if config.date_header else []
    state.default_headers = date + config.encoded_headers


class PeerCredProtocol(FreshDateProtocol):
    """uvicorn's h11 protocol, refusing peers whose uid is not the daemon's
    (``SO_PEERCRED``, unix(7)); the requests of an accepted connection carry
    ``{"uid", "pid"}`` in ``scope[PEER_SCOPE_KEY]``."""

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                log.warning("refused connection", peer_uid=uid)
                # Let uvicorn register the connection, then close it before
                # any byte is read (data_received only runs after this returns).
                super().connection_made(transport)
                transport.close()
                return
            # Who is asking, for the requests of this connection to record.
            self.app = _with_peer(self.app, {"uid": uid, "pid": _pid})
        super().connection_made(transport)


def _with_peer(app: Any, peer: dict[str, int]) -> Any:
    """``app`` with ``scope["jobsup.peer"] = peer`` on every request."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, PEER_SCOPE_KEY: peer}, receive, send)

    return wrapped
