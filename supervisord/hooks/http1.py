"""A lean HTTP/1.1 client for webhook POSTs: h11 over anyio streams, with
kept-alive connections per origin.

The connection is an asyncio protocol feeding h11 (the daemon runs on
anyio's asyncio backend): an anyio byte stream costs, per exchange, reader
pause/resume system calls and cancel-scope bookkeeping that showed in the
profile of 100 back-to-back deliveries.

Why not httpx for every POST: measured on the bench machine
(bench/hooks_delivery.py), one httpx request costs about 1.5 ms of CPU
(its model layers, cancel scopes, two socket writes per request, and
httpcore retrying ``import sniffio`` four times a request when sniffio is
not installed), an h11 exchange about 0.35 ms; with 100 runs ending at once
that difference alone is the 100 ms latency aim. httpx stays for what this
module does not do: a URL that an environment proxy applies to
(:func:`proxied`) is posted with httpx as before.

Shapes: :meth:`Http1Client.post` returns an :class:`Answer` (``status`` int,
``headers`` lower-case name -> value, ``excerpt`` the first ``excerpt_bytes``
of the body) or raises :class:`HttpError` (:class:`HttpTimeout` after
``timeout_s`` seconds for the whole exchange, connect included;
:class:`HttpConnectError` when no connection could be made, TLS
verification included; :class:`HttpProtocolError` for a broken or closed
exchange). https verifies certificates with httpx's default context
(certifi's CA bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``). Redirects
are not followed.

Connection reuse: after a complete exchange whose both sides allow it
(``Connection: keep-alive``, a delimited body of at most
:data:`_DRAIN_BYTES`), the connection goes back to its origin's idle list
(at most :data:`_IDLE_PER_ORIGIN`). An idle connection that became readable
(the server closed it) is dropped before use; a reused connection that fails
before any byte of the answer arrived is retried once on a new connection
(the server may have closed it meanwhile; a webhook is at least once, keyed
by ``X-Jobsup-Event``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import ssl
import urllib.request
from collections.abc import Mapping
from typing import Final
from urllib.parse import unquote, urlsplit

import anyio
import h11
import httpx

__all__ = [
    "Answer",
    "Http1Client",
    "HttpConnectError",
    "HttpError",
    "HttpProtocolError",
    "HttpTimeout",
    "proxied",
]

#: Idle kept-alive connections kept per origin.
_IDLE_PER_ORIGIN: Final = 16
#: A response body longer than this is not read to its end: the connection
#: is closed instead of kept.
_DRAIN_BYTES: Final = 256 * 1024
_RECEIVE: Final = 65536


class HttpError(Exception):
    """A webhook exchange failed without an HTTP answer (message: a short reason)."""


class HttpTimeout(HttpError):
    """No complete answer within the timeout."""


class HttpConnectError(HttpError):
    """No connection (refused, unreachable, DNS, TLS handshake or verification)."""


class HttpProtocolError(HttpError):
    """The connection broke or the server answered something that is not HTTP/1.1."""


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: ``status``, ``headers`` (lower-case names; the last
    value of a repeated header), ``excerpt`` (the first bytes of the body)."""

    status: int
    headers: Mapping[str, str]
    excerpt: bytes


def proxied(url: str) -> bool:
    """Whether an environment proxy (``http_proxy``, ``https_proxy``,
    ``all_proxy``, minus ``no_proxy``) applies to ``url``: such a URL is
    posted through httpx, which implements proxies."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


class _Conn(asyncio.Protocol):
    """One connection: an asyncio protocol feeding what arrives into its h11
    state machine and waking the exchange waiting for it (no stream layer:
    a kept-alive webhook exchange is one write and usually one read)."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.got_bytes = False  # since the current request was sent
        self.eof = False
        self.lost: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.eof:
            return
        self.got_bytes = True
        self.h11.receive_data(data)
        self._wake()

    def eof_received(self) -> bool:
        self._end()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc
        self._end()

    def _end(self) -> None:
        if not self.eof:
            self.eof = True
            self.h11.receive_data(b"")
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def more(self) -> None:
        """Wait until more bytes (or the end) arrived."""
        if self.eof:
            raise HttpProtocolError("the server closed the connection without an answer")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def usable(self) -> bool:
        """Whether an idle connection can carry a new exchange (not closed,
        nothing unexpected received while idle)."""
        return not self.eof and not self.got_bytes and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class Http1Client:
    """POSTs over kept-alive HTTP/1.1 connections (see the module doc).
    ``async with Http1Client() as client:`` closes the idle connections at
    the end; one client is shared by every webhook of the daemon."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> Http1Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def idle_connections(self) -> int:
        """How many kept-alive connections wait for reuse (for tests)."""
        return sum(len(c) for c in self._idle.values())

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        excerpt_bytes: int = 4096,
    ) -> Answer:
        """POST ``body`` to ``url`` (http or https) with ``headers`` (plus
        Host, Content-Length and, for credentials in the URL, Basic
        Authorization) and return the answer. Raises HttpError (see the
        module doc); never the URL in a message (a chat webhook's path is its
        secret)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpProtocolError(f"not an http(s) URL with a host: {parts.scheme}://…")
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        origin = (parts.scheme, host, port)
        shown_host = f"[{host}]" if ":" in host else host
        default_port = port == (443 if parts.scheme == "https" else 80)
        head = [("Host", shown_host if default_port else f"{shown_host}:{port}")]
        if parts.username is not None:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            head.append(("Authorization", "Basic " + base64.b64encode(user).decode()))
        head.extend(headers.items())
        head.append(("Content-Length", str(len(body))))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = h11.Request(method="POST", target=target, headers=head)
        try:
            with anyio.fail_after(timeout_s):
                while True:
                    conn = await self._take(origin)
                    if conn is None:
                        conn = await self._connect(parts.scheme, host, port)
                    try:
                        return await self._exchange(conn, origin, request, body, excerpt_bytes)
                    except _Stale:
                        continue  # a kept-alive connection the server had closed: once more, on a new one
        except TimeoutError:
            raise HttpTimeout(f"no answer within {timeout_s:g} s") from None

    async def _take(self, origin: tuple[str, str, int]) -> _Conn | None:
        conns = self._idle.get(origin)
        while conns:
            conn = conns.pop()
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        return None

    async def _connect(self, scheme: str, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            if scheme == "https":
                if self._tls is None:
                    self._tls = httpx.create_ssl_context()
                _, conn = await loop.create_connection(_Conn, host, port, ssl=self._tls, server_hostname=host)
            else:
                _, conn = await loop.create_connection(_Conn, host, port)
        except (OSError, ssl.SSLError) as exc:
            raise HttpConnectError(f"ConnectError: {_reason(exc)}") from None
        return conn

    async def _exchange(
        self, conn: _Conn, origin: tuple[str, str, int], request: h11.Request, body: bytes, excerpt_bytes: int
    ) -> Answer:
        """One request/answer on ``conn``; puts ``conn`` back when it can
        carry another, else closes it (also on any failure or cancellation)."""
        h = conn.h11
        keep = False
        try:
            try:
                assert conn.transport is not None
                data = h.send(request) + h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage())
                conn.got_bytes = False
                conn.transport.write(data)
                status, headers = 0, {}
                excerpt = bytearray()
                read = 0
                while True:
                    event = h.next_event()
                    if event is h11.NEED_DATA:
                        await conn.more()
                        continue
                    if isinstance(event, h11.Response):
                        status = event.status_code
                        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                    elif isinstance(event, h11.Data):
                        excerpt.extend(event.data[: max(0, excerpt_bytes - len(excerpt))])
                        read += len(event.data)
                        if read > _DRAIN_BYTES:
                            break  # not worth draining: the connection is closed
                    elif isinstance(event, h11.EndOfMessage):
                        keep = h.our_state is h11.DONE and h.their_state is h11.DONE
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        raise HttpProtocolError("the server closed the connection without an answer")
            except (OSError, h11.ProtocolError) as exc:
                if conn.reused and not conn.got_bytes:
                    raise _Stale from None
                raise HttpProtocolError(f"RemoteProtocolError: {_reason(exc)}") from None
            except HttpProtocolError:
                if conn.reused and not conn.got_bytes:
                    raise _Stale from None
                raise
            if status == 0:
                raise HttpProtocolError("RemoteProtocolError: no answer")
            return Answer(status, headers, bytes(excerpt))
        finally:
            idle = self._idle.setdefault(origin, [])
            if keep and len(idle) < _IDLE_PER_ORIGIN:
                h.start_next_cycle()
                conn.reused = False
                conn.got_bytes = False
                idle.append(conn)
            else:
                conn.close()


class _Stale(Exception):
    """A reused connection failed before any byte of the answer."""


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:300]
