"""The lean webhook HTTP/1.1 client against real local servers: kept-alive
connections, a kept connection the server dropped, chunked and long
answers, timeouts, refused connections, and posting through httpx where an
environment proxy applies."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest

from supervisord.daemon.hooks.http1 import Http1Client, HttpConnectError, HttpTimeout, proxied
from tests.supervisord.hooks.webhook_server import Reply, WebhookServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

HEADERS = {"Content-Type": "application/json", "X-Jobsup-Event": "7"}


async def test_posts_reuse_one_kept_alive_connection() -> None:
    with WebhookServer(default=Reply(201, body=b"made")) as srv:
        async with Http1Client() as client:
            answers = [await client.post(srv.url, b'{"n": %d}' % i, HEADERS, timeout_s=5) for i in range(5)]
            assert client.idle_connections() == 1
    assert [(a.status, a.excerpt) for a in answers] == [(201, b"made")] * 5
    assert len({r.peer for r in srv.received}) == 1  # one connection carried all five
    assert [r.body for r in srv.received] == [b'{"n": %d}' % i for i in range(5)]
    assert srv.received[0].headers["x-jobsup-event"] == "7"
    assert srv.received[0].headers["host"] == srv.url.split("/")[2]


async def test_connection_close_is_not_kept() -> None:
    with WebhookServer(default=Reply(200, headers={"Connection": "close"})) as srv:
        async with Http1Client() as client:
            for _ in range(3):
                assert (await client.post(srv.url, b"{}", HEADERS, timeout_s=5)).status == 200
            assert client.idle_connections() == 0
    assert len({r.peer for r in srv.received}) == 3


class RawServer:
    """A TCP server whose ``answer(n, request)`` makes the bytes sent for
    the n-th request (0-based, per connection); None closes the connection
    without an answer."""

    def __init__(self, answer: Callable[[int, bytes], bytes | None]) -> None:
        self.answer = answer
        self.requests: list[tuple[int, bytes]] = []  # (connection number, request head)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn_no = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn, conn_no), daemon=True).start()
            conn_no += 1

    def _one(self, conn: socket.socket, conn_no: int) -> None:
        buf = b""
        n = 0
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = int(
                    next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                )
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.requests.append((conn_no, head))
                reply = self.answer(n, head)
                n += 1
                if reply is None:
                    return
                conn.sendall(reply)

    def close(self) -> None:
        self.sock.close()


async def test_a_kept_connection_the_server_dropped_is_retried_once_on_a_new_one() -> None:
    # The server answers the first request of each connection and drops the
    # connection when a second one comes (what an idle timeout on the server
    # does to a request sent just as it closes).
    srv = RawServer(lambda n, _: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" if n == 0 else None)
    try:
        async with Http1Client() as client:
            first = await client.post(srv.url, b"{}", HEADERS, timeout_s=5)
            second = await client.post(srv.url, b"{}", HEADERS, timeout_s=5)
    finally:
        srv.close()
    assert (first.status, second.status) == (200, 200)
    assert [c for c, _ in srv.requests] == [0, 0, 1]


async def test_chunked_and_long_answers_keep_the_connection_and_an_excerpt() -> None:
    body = b"x" * 10_000
    chunked = b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n"
    chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    srv = RawServer(lambda n, _: chunked)
    try:
        async with Http1Client() as client:
            answers = [await client.post(srv.url, b"{}", HEADERS, timeout_s=5, excerpt_bytes=4096) for _ in range(2)]
            assert client.idle_connections() == 1
    finally:
        srv.close()
    assert [(a.status, len(a.excerpt), a.headers["retry-after"]) for a in answers] == [(500, 4096, "3")] * 2
    assert [c for c, _ in srv.requests] == [0, 0]


async def test_no_answer_times_out_and_drops_the_connection() -> None:
    release = threading.Event()
    try:
        with WebhookServer(default=Reply(hold=release)) as srv:
            async with Http1Client() as client:
                with pytest.raises(HttpTimeout, match="no answer within 0.5 s"):
                    await client.post(srv.url, b"{}", HEADERS, timeout_s=0.5)
                assert client.idle_connections() == 0
    finally:
        release.set()


async def test_refused_connection_is_a_connect_error_without_the_url() -> None:
    with WebhookServer() as srv:
        url = srv.url
    async with Http1Client() as client:
        with pytest.raises(HttpConnectError) as err:
            await client.post(url, b"{}", HEADERS, timeout_s=5)
    assert "ConnectError" in str(err.value) and "s3cr3t-path" not in str(err.value)


def test_proxied_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    assert not proxied("http://hooks.example/x")
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    assert proxied("https://hooks.example/x") and not proxied("http://hooks.example/x")
    monkeypatch.setenv("no_proxy", "hooks.example")
    assert not proxied("https://hooks.example/x")


async def test_each_request_is_the_templates_head_plus_its_own_headers_and_length() -> None:
    # The constant part (request line, Host, Basic credentials, constant
    # headers) is made by h11 once; each request adds its own headers and
    # Content-Length: what goes on the wire must still be exactly that.
    srv = RawServer(lambda n, _: b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
    url = srv.url.replace("http://", "http://us%3Aer:p%40ss@") + "?a=1"
    try:
        async with Http1Client() as client:
            for i, body in enumerate([b"{}", b'{"n": 12345}', b""]):
                fresh = {"X-Jobsup-Event": str(i + 1)} | ({"X-Jobsup-Signature": "sha256=ab12"} if i == 1 else {})
                answer = await client.post(url, body, {"User-Agent": "jobsup/test"}, timeout_s=5, fresh=fresh)
                assert answer.status == 204
    finally:
        srv.close()
    assert [c for c, _ in srv.requests] == [0, 0, 0]  # one kept-alive connection
    heads = [head.decode().split("\r\n") for _, head in srv.requests]
    for i, (lines, length) in enumerate(zip(heads, [2, 12, 0], strict=True)):
        assert lines[0] == "POST /hook?a=1 HTTP/1.1"
        fields = [tuple(line.split(": ", 1)) for line in lines[1:]]
        names = [name.lower() for name, _ in fields]
        assert len(names) == len(set(names))  # nothing twice (one Content-Length)
        got = {name.lower(): value for name, value in fields}
        assert got["host"] == srv.url.split("/")[2]
        assert got["authorization"] == "Basic dXM6ZXI6cEBzcw=="  # us:er:p@ss
        assert got["user-agent"] == "jobsup/test"
        assert got["x-jobsup-event"] == str(i + 1)
        assert got["content-length"] == str(length)
        assert ("x-jobsup-signature" in got) == (i == 1)


@pytest.mark.parametrize(
    ("headers", "fresh", "match"),
    [
        ({}, {"X-Jobsup-Event": "1\r\nX-Evil: 1"}, "not a plain ASCII value"),
        ({}, {"X-Jobsup-Event": " 1"}, "not a plain ASCII value"),
        ({}, {"X-Jobsup-Event": "é"}, "not a plain ASCII value"),
        ({}, {"X Jobsup": "1"}, "not a header name"),
        ({}, {"Content-Length": "1"}, "set by the client"),
        ({}, {"Connection": "close"}, "set by the client"),
        ({"Transfer-Encoding": "chunked"}, {}, "set by the client"),
    ],
)
async def test_headers_that_could_break_the_request_are_refused_before_sending(
    headers: dict[str, str], fresh: dict[str, str], match: str
) -> None:
    srv = RawServer(lambda n, _: b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
    try:
        async with Http1Client() as client:
            with pytest.raises(ValueError, match=match):
                await client.post(srv.url, b"{}", headers, timeout_s=5, fresh=fresh)
            assert (await client.post(srv.url, b"{}", {}, timeout_s=5, fresh={"X-Jobsup-Event": "2"})).status == 204
    finally:
        srv.close()
    [(_, head)] = srv.requests  # only the good one was sent
    assert b"X-Jobsup-Event: 2\r\n" in head and b"Evil" not in head
