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
that difference alone is the 100 ms latency aim. With sniffio installed,
100 webhooks at once (bench/hooks_delivery.py, both clients in the same
five rounds, load average 46 to 20) took p50 112 ms / p99 574 ms here
against httpx's 237 ms / 1,280 ms. httpx stays for what this module does
not do: a URL that an environment proxy applies to (:func:`proxied`).
Errors use httpx's words (``ConnectError: ...``, ``RemoteProtocolError:
...``), so a HookFailed reads the same whichever client posted it
(tests/supervisord/hooks/test_hooks_client_parity.py).

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
import re
import ssl
import urllib.request
from collections.abc import Mapping
from typing import Final, Self
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
#: Request templates kept (one per webhook URL and set of constant headers).
_TEMPLATES: Final = 256
#: Headers a request's own (``fresh``) headers may not set: the client's
#: framing, and those that change how h11 reads the answer (h11 sees the
#: template's request, not these).
_NOT_FRESH: Final = frozenset({"content-length", "transfer-encoding", "host", "connection", "upgrade", "expect"})
#: The error of an exchange the server ended before any answer: httpx's
#: (httpcore's) words, so that a webhook's HookFailed reads the same
#: whichever client posted it.
_DISCONNECTED: Final = "RemoteProtocolError: Server disconnected without sending a response."
_TOKEN: Final = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")


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

    async def more(self, deadline: float, timeout_s: float) -> None:
        """Wait until more bytes (or the end) arrived; HttpTimeout at
        ``deadline`` (the event loop's clock; ``timeout_s`` for the
        message). A timer on the waiter: no cancel scope per wait."""
        if self.eof:
            raise HttpProtocolError(_DISCONNECTED)
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(deadline, _time_out, waiter, timeout_s)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def usable(self) -> bool:
        """Whether an idle connection can carry a new exchange (not closed,
        nothing unexpected received while idle)."""
        return not self.eof and not self.got_bytes and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _time_out(waiter: asyncio.Future[None], timeout_s: float) -> None:
    if not waiter.done():
        waiter.set_exception(HttpTimeout(f"no answer within {timeout_s:g} s"))


@dataclasses.dataclass(frozen=True, slots=True)
class _Template:
    """The part of a POST that is the same for every request to one URL
    with one set of constant headers: the origin ``(scheme, host, port)``;
    ``request``, an h11 Request of the request line and those headers
    (Host, Basic Authorization for credentials in the URL, then the given
    ones; validated by h11 when made, once), which moves the connection's
    h11 state machine for each request; and ``head``, its bytes as h11
    wrote them, without the blank line that ends the header block."""

    origin: tuple[str, str, int]
    request: h11.Request
    head: bytes


def _template(url: str, headers: Mapping[str, str]) -> _Template:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpProtocolError(f"not an http(s) URL with a host: {parts.scheme}://…")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    shown_host = f"[{host}]" if ":" in host else host
    default_port = port == (443 if parts.scheme == "https" else 80)
    head = [("Host", shown_host if default_port else f"{shown_host}:{port}")]
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        head.append(("Authorization", "Basic " + base64.b64encode(user).decode()))
    for name in headers:
        if name.lower() in ("content-length", "transfer-encoding"):
            raise ValueError(f"header {name} is set by the client")
    head.extend(headers.items())
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = h11.Request(method="POST", target=path, headers=head)
    written = h11.Connection(h11.CLIENT).send(request)
    assert written is not None
    assert written.endswith(b"\r\n\r\n")
    return _Template((parts.scheme, host, port), request, written[:-2])


def _fresh_line(name: str, value: str) -> bytes:
    """One header line of a request's own headers. The name must be a
    token (RFC 9110 5.6.2), the value visible ASCII and inner spaces: no
    control character (so no CR or LF), nothing to fold or trim."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"not a header name: {name!r}")
    if not (value.isascii() and value.isprintable() and value == value.strip()):
        raise ValueError(f"header {name}: not a plain ASCII value: {value!r}")
    return f"{name}: {value}\r\n".encode("ascii")


class Http1Client:
    """POSTs over kept-alive HTTP/1.1 connections (see the module doc).
    ``async with Http1Client() as client:`` closes the idle connections at
    the end; one client is shared by every webhook of the daemon."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._tls: ssl.SSLContext | None = None
        # (url, constant headers) -> its request template (a hook posts to its URL again and again)
        self._templates: dict[tuple[str, tuple[tuple[str, str], ...]], _Template] = {}

    async def __aenter__(self) -> Self:
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
        fresh: Mapping[str, str] | None = None,
    ) -> Answer:
        """POST ``body`` to ``url`` (http or https) with ``headers`` (plus
        Host, Content-Length and, for credentials in the URL, Basic
        Authorization) and ``fresh`` headers, and return the answer. Raises
        HttpError (see the module doc); never the URL in a message (a chat
        webhook's path is its secret).

        ``headers`` are the ones that stay the same from request to request
        (validated by h11 once per URL and set of headers: see
        :class:`_Template`); ``fresh`` the ones of this request only (an
        idempotency key, a signature): a token name and a printable ASCII
        value, checked here (ValueError otherwise). Neither may set
        Content-Length or Transfer-Encoding, nor ``fresh`` Host,
        Connection, Upgrade or Expect (ValueError)."""
        key = (url, tuple(headers.items()))
        template = self._templates.get(key)
        if template is None:
            template = _template(url, headers)
            if len(self._templates) >= _TEMPLATES:
                self._templates.clear()
            self._templates[key] = template
        lines = [template.head]
        if fresh:
            for name, value in fresh.items():
                if name.lower() in _NOT_FRESH:
                    raise ValueError(f"header {name} is set by the client")
                lines.append(_fresh_line(name, value))
        lines.append(b"Content-Length: %d\r\n\r\n" % len(body))
        lines.append(body)
        data = b"".join(lines)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            conn = self._take(template.origin)
            if conn is None:
                try:
                    with anyio.fail_after(max(0.0, deadline - loop.time())):
                        conn = await self._connect(*template.origin)
                except TimeoutError:
                    raise HttpTimeout(f"no answer within {timeout_s:g} s") from None
            try:
                return await self._exchange(conn, template, data, excerpt_bytes, deadline, timeout_s)
            except _Stale:
                continue  # a kept-alive connection the server had closed: once more, on a new one

    def _take(self, origin: tuple[str, str, int]) -> _Conn | None:
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
        self,
        conn: _Conn,
        template: _Template,
        data: bytes,
        excerpt_bytes: int,
        deadline: float,
        timeout_s: float,
    ) -> Answer:
        """One request (``data``: its bytes) and its answer on ``conn``;
        puts ``conn`` back when it can carry another, else closes it (also
        on any failure or cancellation). The template's request moves h11's
        state machine as if it had written the request (a POST of the same
        request line, HTTP version and connection headers: what h11 needs
        to read the answer), its body framing aside."""
        h = conn.h11
        origin = template.origin
        keep = False
        try:
            try:
                assert conn.transport is not None
                h.send(template.request)
                h.send(h11.EndOfMessage())
                conn.got_bytes = False
                conn.transport.write(data)
                status, headers = 0, {}
                excerpt = bytearray()
                read = 0
                while True:
                    event = h.next_event()
                    if event is h11.NEED_DATA:
                        await conn.more(deadline, timeout_s)
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
                        raise HttpProtocolError(_DISCONNECTED)
            except (OSError, h11.ProtocolError) as exc:
                if conn.reused and not conn.got_bytes:
                    raise _Stale from None
                if conn.eof and status == 0:
                    raise HttpProtocolError(_DISCONNECTED) from None
                raise HttpProtocolError(f"RemoteProtocolError: {_reason(exc)}") from None
            except HttpProtocolError:
                if conn.reused and not conn.got_bytes:
                    raise _Stale from None
                raise
            if status == 0:
                raise HttpProtocolError(_DISCONNECTED)
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
