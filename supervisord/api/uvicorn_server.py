"""Everything jobsup takes from uvicorn, in one module: the daemon's API on
its Unix socket and the web page on TCP are both served by :class:`Server`
with a :class:`Config`; the API's connections use :class:`PeerCredProtocol`.

Subclassing reaches into uvicorn's own methods (``Server.capture_signals``,
``H11Protocol.connection_made``), which are not a documented API: this is
the one place to check when uvicorn changes, and pyproject.toml bounds
uvicorn to the versions checked here (tests/supervisord/test_uvicorn_server.py
fails when a method overridden here no longer exists).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import anyio
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["PEER_SCOPE_KEY", "Config", "PeerCredProtocol", "Server"]

log = structlog.get_logger("jobsup.api")

#: uvicorn's server settings (re-exported: callers import nothing of uvicorn).
Config = uvicorn.Config

#: The ASGI scope key holding the peer's ``{"uid", "pid"}`` (SO_PEERCRED).
PEER_SCOPE_KEY = "jobsup.peer"


class Server(uvicorn.Server):
    """uvicorn's server without its own signal handling: the daemon owns
    SIGTERM and SIGINT (anyio's signal receiver) and stops each server with
    :meth:`stop_listening`. uvicorn's ``serve`` wraps itself in
    ``capture_signals``, which would replace the daemon's handlers with
    ``signal.signal`` while the server runs and raise the signal again when it
    ends; here it does nothing. :attr:`ready` is set once it listens (create
    the server on the event loop)."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        #: Set once the server listens (uvicorn's ``started``).
        self.ready = anyio.Event()

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


class PeerCredProtocol(H11Protocol):
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
