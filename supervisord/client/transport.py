"""HTTP/1.1 over the daemon's Unix socket, for the CLI's API client: one
request per connection, the response read as it arrives.

Why not :mod:`http.client` (or httpx): every CLI command is a new process,
and what it imports is paid on every call by the scripts and agents that
drive jobsup (target: 100 ms for ``jobsup runs``, bench/cli_latency.py).
:mod:`http.client` imports :mod:`ssl` and the :mod:`email` parser (about
20 ms together on a loaded machine); httpx much more. The daemon's side is
uvicorn, on one local socket: no TLS, no proxies, no redirects, no
cookies, no keep-alive (each request says ``Connection: close``). What is
left of HTTP/1.1 is small (RFC 9112): a request line and headers; a status
line and headers back; a body framed by ``Content-Length``, by
``Transfer-Encoding: chunked`` (streams), or by the end of the connection.

:class:`UnixConnection` checks the socket before sending anything (its
folder private to this user, the listening process running as this user).
Every error is an :class:`OSError`: the socket's own, a timeout, or
:class:`ProtocolError` for a response that breaks HTTP/1.1 or ends early.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from supervisord.shared.ownership import UnsafePathError, check_private_dir, peer_cred

__all__ = ["ProtocolError", "Response", "UnixConnection", "quote_path", "urlencode"]

#: Longest status line, header line or chunk-size line accepted (bytes).
_MAX_LINE = 64 * 1024
#: Most header lines accepted in one response.
_MAX_HEADERS = 100
#: Bytes read from the socket at once.
_READ_SIZE = 64 * 1024

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


class ProtocolError(OSError):
    """The daemon's response is not HTTP/1.1 as this client reads it, or the
    connection ended before the response did."""


def _quote(text: str, safe: bytes, *, plus: bool) -> str:
    """Percent-encode ``text`` as UTF-8 (RFC 3986): unreserved characters
    and ``safe`` bytes stay; with ``plus`` a space becomes ``+``
    (form encoding, as :func:`urllib.parse.quote_plus`)."""
    out = []
    for byte in text.encode("utf-8"):
        if byte in _UNRESERVED or byte in safe:
            out.append(chr(byte))
        elif plus and byte == 0x20:
            out.append("+")
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def quote_path(path: str) -> str:
    """``path`` percent-encoded for a request line, ``/`` kept (as
    :func:`urllib.parse.quote` with its defaults)."""
    return _quote(path, b"/", plus=False)


def urlencode(query: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> str:
    """A query string from pairs (or a mapping); a list or tuple value gives
    one pair per item (as :func:`urllib.parse.urlencode` with ``doseq``);
    values that are not strings are written with ``str``."""
    pairs = query.items() if isinstance(query, Mapping) else query
    return "&".join(
        f"{_quote(str(key), b'', plus=True)}={_quote(str(v), b'', plus=True)}"
        for key, value in pairs
        for v in (value if isinstance(value, (list, tuple)) else [value])
    )


class Response:
    """The response to one request: :attr:`status` and :attr:`headers`
    (lower-case names) once constructed, the body through :meth:`read`,
    :meth:`read1` and :meth:`readline`, as it arrives. Raises OSError
    (ProtocolError, a timeout) from any of them."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = b""  # bytes read from the socket; self._pos: how far consumed
        self._pos = 0
        self._eof = False
        self._pending = b""  # body bytes read past the last readline(), from self._ppos
        self._ppos = 0
        self._started_chunks = False
        line = self._line()
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 status line: {line[:80]!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            line = self._line()
            if not line:
                break
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"not an HTTP header line: {line[:80]!r}")
            self.headers[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
        else:
            raise ProtocolError(f"more than {_MAX_HEADERS} header lines")
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        if self._chunked:
            self._left: int | None = 0
        elif length is not None:
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length: {length[:40]!r}")
            self._left = int(length)
        else:
            self._left = None  # until the connection ends
        self._done = self._left == 0 and not self._chunked

    # -- the socket, buffered -----------------------------------------------

    def _fill(self) -> bool:
        """Read more from the socket into the buffer; False at its end."""
        if self._eof:
            return False
        data = self._sock.recv(_READ_SIZE)
        if not data:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + data
        self._pos = 0
        return True

    def _line(self) -> bytes:
        """The next CRLF- (or LF-) ended line of the head, without its end."""
        while True:
            nl = self._buf.find(b"\n", self._pos)
            if nl >= 0:
                line = self._buf[self._pos : nl]
                self._pos = nl + 1
                return line[:-1] if line.endswith(b"\r") else line
            if len(self._buf) - self._pos > _MAX_LINE:
                raise ProtocolError(f"a line longer than {_MAX_LINE} bytes")
            if not self._fill():
                raise ProtocolError("the connection ended in the middle of the response head")

    def _take(self, n: int) -> bytes:
        """Up to ``n`` buffered (else newly read) bytes; b"" at the socket's end."""
        if self._pos >= len(self._buf) and not self._fill():
            return b""
        data = self._buf[self._pos : self._pos + n]
        self._pos += len(data)
        return data

    # -- the body ------------------------------------------------------------

    def _next_chunk_size(self) -> None:
        """At a chunk boundary: read the next chunk's size (RFC 9112 7.1);
        after the last chunk, its trailer lines, and mark the body done."""
        if self._left == 0 and self._started_chunks and self._line():
            raise ProtocolError("a chunk that does not end with CRLF")
        self._started_chunks = True
        size_line = self._line().split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size: {size_line[:40]!r}") from None
        if size < 0:
            raise ProtocolError(f"bad chunk size: {size_line[:40]!r}")
        if size == 0:
            while self._line():
                pass
            self._done = True
        self._left = size

    def read1(self, n: int = _READ_SIZE) -> bytes:
        """Up to ``n`` bytes of the body, at least one unless it has ended
        (b""), without waiting for more than one read of the socket."""
        if self._ppos < len(self._pending):
            data = self._pending[self._ppos : self._ppos + n]
            self._ppos += len(data)
            return data
        return self._body_bytes(n)

    def _body_bytes(self, n: int) -> bytes:
        """:meth:`read1` past what :meth:`readline` holds."""
        while not self._done:
            if self._chunked and self._left == 0:
                self._next_chunk_size()
                continue
            want = n if self._left is None else min(n, self._left)
            data = self._take(want)
            if not data:
                if self._left is None:
                    self._done = True
                    return b""
                raise ProtocolError(f"the connection ended with {self._left} bytes of the body missing")
            if self._left is not None:
                self._left -= len(data)
                if self._left == 0 and not self._chunked:
                    self._done = True
            return data
        return b""

    def read(self) -> bytes:
        """The rest of the body."""
        parts: list[bytes] = []
        while True:
            data = self.read1(1 << 20)
            if not data:
                return b"".join(parts)
            parts.append(data)

    def readline(self) -> bytes:
        """The body's next line, with its ``\\n`` (only ``\\n`` ends a line);
        the last one may lack it; b"" at the end of the body. Each byte is
        scanned and copied once however short the lines are."""
        parts: list[bytes] = []
        while True:
            nl = self._pending.find(b"\n", self._ppos)
            if nl >= 0:
                parts.append(self._pending[self._ppos : nl + 1])
                self._ppos = nl + 1
                return b"".join(parts)
            if self._ppos < len(self._pending):
                parts.append(self._pending[self._ppos :])
            self._pending, self._ppos = self._body_bytes(_READ_SIZE), 0
            if not self._pending:
                return b"".join(parts)


class UnixConnection:
    """One HTTP/1.1 request to the Unix socket ``path``: ``connect_timeout``
    bounds the connect, ``timeout`` each later send and read."""

    def __init__(self, path: str, *, timeout: float, connect_timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.sock: socket.socket | None = None

    def connect(self) -> None:
        """Connect to the socket, refusing one jobsup must not trust before a
        byte is sent: its folder must belong to this user and be writable by
        nobody else (so no other user can have put the socket there), and
        the process listening on it must run as this user (``SO_PEERCRED``,
        unix(7)). Raises OSError (refused, missing, timeout), UnsafePathError
        naming the socket."""
        from pathlib import Path

        folder = os.path.dirname(self.path)
        try:
            check_private_dir(Path(folder), what="socket folder", fix=f"refusing to send anything to {self.path}")
        except FileNotFoundError:
            raise ConnectionRefusedError(f"no socket folder {folder}") from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connect_timeout)
            sock.connect(self.path)
            cred = peer_cred(sock)
            if cred.uid != os.getuid():
                raise UnsafePathError(
                    f"the process answering on {self.path} (pid {cred.pid}) runs as uid {cred.uid}, not as you "
                    f"(uid {os.getuid()}); refusing to send anything to it"
                )
            sock.settimeout(self.timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def request(self, method: str, target: str, *, body: bytes | None, headers: Mapping[str, str]) -> Response:
        """Connect, send ``method target`` with ``headers`` (plus
        ``Content-Length`` and ``Connection: close``) and ``body``, and
        return the response once its head has arrived. Raises OSError,
        UnsafePathError."""
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        head = [f"{method} {target} HTTP/1.1"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            head.append(f"Content-Length: {len(body)}")
        head.append("Connection: close")
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
        return Response(self.sock)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
