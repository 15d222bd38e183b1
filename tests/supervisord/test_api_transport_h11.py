"""Property test: the CLI's HTTP/1.1 reader (supervisord.client.transport)
against responses written by h11, a reference HTTP/1.1 implementation:
varied statuses, headers, bodies framed by Content-Length, chunked (with
trailers) or the end of the connection, delivered split at arbitrary points
and read with any mix of ``read``, ``read1`` and ``readline``."""

from __future__ import annotations

import socket
from typing import cast

import h11
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisord.client.transport import Response

#: Header names h11 or the framing own; the test's own headers avoid them.
_RESERVED = {"content-length", "transfer-encoding", "connection", "date", "server"}

_names = st.from_regex(r"\A[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,20}\Z").filter(lambda n: n.lower() not in _RESERVED)
# A visible character at each end: the reader strips the optional whitespace around a value.
_values = st.from_regex(r"\A([\x21-\x7e]([\x20-\x7e]{0,30}[\x21-\x7e])?)?\Z")
_headers = st.lists(st.tuples(_names, _values), max_size=8, unique_by=lambda h: h[0].lower())
_statuses = st.integers(200, 599).filter(lambda s: s not in (204, 304))
_bodies = st.lists(st.binary(max_size=300) | st.sampled_from([b"\n", b"{}\n", b"a\nb", b"\r\n"]), max_size=8)


class _Pieces:
    """A socket whose ``recv`` returns the bytes in the given pieces (never
    more than asked), then b"" (the peer closed)."""

    def __init__(self, raw: bytes, cuts: list[int]) -> None:
        points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
        self.pieces = [raw[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]

    def recv(self, n: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > n:
            self.pieces.insert(0, piece[n:])
        return piece[:n]


def _written_by_h11(
    status: int, headers: list[tuple[str, str]], chunks: list[bytes], framing: str, trailers: list[tuple[str, str]]
) -> bytes:
    """The bytes an h11 server sends for this response to a GET."""
    server = h11.Connection(h11.SERVER)
    version = b"1.0" if framing == "close" else b"1.1"
    server.receive_data(b"GET /v1/runs HTTP/" + version + b"\r\nHost: jobsup\r\n\r\n")
    assert isinstance(server.next_event(), h11.Request)
    head = list(headers)
    if framing == "length":
        head.append(("Content-Length", str(sum(map(len, chunks)))))
    elif framing == "chunked":
        head.append(("Transfer-Encoding", "chunked"))
    out = server.send(h11.Response(status_code=status, headers=head))
    for chunk in chunks:
        out += server.send(h11.Data(data=chunk)) or b""
    out += server.send(h11.EndOfMessage(headers=trailers if framing == "chunked" else [])) or b""
    assert out is not None
    return out


def _read_body(resp: Response, modes: list[int]) -> bytes:
    """The body through a mix of readers: 0 readline, 1 read1 (small), 2 read1, 3 read."""
    parts: list[bytes] = []
    for mode in [*modes, 3]:
        if mode == 0:
            line = resp.readline()
            assert line.endswith(b"\n") or b"\n" not in line
            parts.append(line)
        elif mode in (1, 2):
            parts.append(resp.read1(3 if mode == 1 else 4096))
        else:
            parts.append(resp.read())
            break
    return b"".join(parts)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    status=_statuses,
    headers=_headers,
    chunks=_bodies,
    framing=st.sampled_from(["length", "chunked", "close"]),
    trailers=_headers,
    cuts=st.lists(st.integers(0, 10_000), max_size=30),
    modes=st.lists(st.integers(0, 2), max_size=12),
)
def test_reads_what_h11_writes(
    status: int,
    headers: list[tuple[str, str]],
    chunks: list[bytes],
    framing: str,
    trailers: list[tuple[str, str]],
    cuts: list[int],
    modes: list[int],
) -> None:
    raw = _written_by_h11(status, headers, chunks, framing, trailers)
    resp = Response(cast(socket.socket, _Pieces(raw, cuts)))
    assert resp.status == status
    for name, value in headers:
        assert resp.headers[name.lower()] == value
    if framing == "chunked":
        assert "chunked" in resp.headers["transfer-encoding"]
    assert _read_body(resp, modes) == b"".join(chunks)
    assert resp.read() == b"" and resp.readline() == b""
