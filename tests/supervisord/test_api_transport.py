"""The CLI's HTTP/1.1 transport (:mod:`supervisord.client.transport`) against
byte-exact responses, split into the worst pieces a socket may deliver."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from supervisord.client.api import Client
from supervisord.client.transport import ProtocolError, Response, quote_path, urlencode
from supervisord.shared.exceptions import DaemonUnreachableError
from supervisord.shared.paths import Paths


def _response(raw: bytes, *, piece: int = 1) -> Response:
    """A Response reading ``raw``, delivered ``piece`` bytes at a time."""
    a, b = socket.socketpair()

    def send() -> None:
        with b:
            for i in range(0, len(raw), piece):
                try:
                    b.sendall(raw[i : i + piece])
                except BrokenPipeError:
                    return  # the reader stopped at a broken response: the rest is not needed

    threading.Thread(target=send, daemon=True).start()
    a.settimeout(10)
    return Response(a)


CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'7\r\n{"a":1}\r\n'
    b'9;ext=1\r\n\n{"b":2}\n\r\n'
    b"3\r\n{}\n\r\n"
    b"0\r\ntrailer: x\r\n\r\n"
)


@pytest.mark.parametrize("piece", [1, 2, 5, 1000])
def test_chunked_lines_across_chunk_and_read_boundaries(piece: int) -> None:
    resp = _response(CHUNKED, piece=piece)
    assert resp.status == 200
    assert resp.headers["content-type"] == "application/x-ndjson"
    lines = []
    while line := resp.readline():
        lines.append(line)
    assert lines == [b'{"a":1}\n', b'{"b":2}\n', b"{}\n"]
    assert resp.read() == b""


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_content_length_and_until_close(piece: int) -> None:
    resp = _response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nhelloEXTRA", piece=piece)
    assert (resp.status, resp.read()) == (404, b"hello")
    resp = _response(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", piece=piece)
    assert resp.read() == b"until the end"
    resp = _response(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", piece=piece)
    assert resp.read1() == b""


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # ends early
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",  # ends inside a chunk
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunk size
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX",  # chunk without CRLF
        b"SSH-2.0-OpenSSH\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nContent-Len",  # ends inside the head
    ],
)
def test_broken_responses_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        _response(raw).read()


def test_a_daemon_that_dies_mid_answer_is_unreachable(tmp_path: Path) -> None:
    """What the client makes of a response cut short: the daemon is gone
    (DaemonUnreachableError naming the socket), not a traceback."""
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    path = folder / "jobsup.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"runs": [')

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(DaemonUnreachableError, match="lost the jobsup daemon on .*jobsup.sock"):
            Client(Paths(state_dir=tmp_path, socket=path)).runs()
    finally:
        server.close()


def test_url_encoding_matches_urllib() -> None:
    from urllib.parse import quote
    from urllib.parse import urlencode as std_urlencode

    for path in ["/v1/runs/abcd", "/v1/runs/a b/../é?#%", "/v1/runs/\u2028"]:
        assert quote_path(path) == quote(path)
    query = [("run", "a b"), ("run", "c&d=é"), ("for", "terminal"), ("after", 3), ("timeout", 1.5), ("x", ["1", "2"])]
    assert urlencode(query) == std_urlencode(query, doseq=True)
    assert urlencode({"all": "1", "project": "p+q"}) == std_urlencode({"all": "1", "project": "p+q"}, doseq=True)
