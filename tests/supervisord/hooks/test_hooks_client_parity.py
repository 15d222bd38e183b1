"""The lean webhook client (supervisord.daemon.hooks.http1) classifies every
server answer as httpx does: the same server answers, posted once with each
client through :func:`post_event`, give the same attempt (delivered or not,
retried or not, status, body excerpt, Retry-After) and the same error
vocabulary (``HTTP <status>``, ``ConnectError: ...``,
``RemoteProtocolError: ...``, ``no answer within N s (...)``).

bench/hooks_delivery.py measured both (same run, five rounds): the lean
client delivers 100 simultaneous webhooks with about half httpx's p99, so
it stays the client; httpx posts only where an environment proxy applies."""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest

from supervisord.daemon.hooks.attempt import Attempt
from supervisord.daemon.hooks.http1 import Http1Client
from supervisord.daemon.hooks.webhook import post_event
from supervisord.shared.hooksconfig import WebhookTarget
from tests.supervisord.hooks.test_hooks_http1 import RawServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

_LONG = b"x" * 10_000
ANSWERS: dict[str, bytes | None] = {
    "200": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "201-chunked-long": b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
    % (len(_LONG), _LONG),
    "204": b"HTTP/1.1 204 No Content\r\n\r\n",
    "200-not-utf8": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n\xff\xfeok",
    "301-not-followed": b"HTTP/1.1 301 Moved\r\nLocation: http://127.0.0.1:1/x\r\nContent-Length: 0\r\n\r\n",
    "400": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\n\r\nbad",
    "404": b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
    "408": b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n",
    "429-retry-after": b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nslow",
    "500-chunked": b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n4\r\nboom\r\n0\r\n\r\n",
    "503-close": b"HTTP/1.1 503 Unavailable\r\nConnection: close\r\nContent-Length: 14\r\n\r\ndown for a bit",
    "closed-without-answer": None,
    "not-http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
}


def _kind(error: str | None) -> str | None:
    """An error's kind: ``HTTP <status>``, ``no answer within <N> s`` (the
    exception named after it differs: a whole-exchange timeout against
    httpx's ConnectTimeout/ReadTimeout), else the exception name before
    ``:`` (ConnectError, RemoteProtocolError)."""
    if error is None:
        return None
    match = re.match(r"HTTP \d{3}$|no answer within [\d.]+ s|[A-Za-z]+(?=: )", error)
    return match.group(0) if match else error


async def _attempts(url: str, timeout_s: float = 5.0) -> tuple[Attempt, Attempt]:
    target = WebhookTarget(url, timeout_s=timeout_s)
    async with Http1Client() as lean:
        ours = await post_event(lean, target, b"{}", 1, None)
    async with httpx.AsyncClient(follow_redirects=False) as client:
        theirs = await post_event(client, target, b"{}", 1, None)
    return ours, theirs


def _same(ours: Attempt, theirs: Attempt) -> None:
    fields = ("ok", "retry", "status", "output", "retry_after_s")
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(theirs, f) for f in fields}
    assert _kind(ours.error) == _kind(theirs.error), (ours.error, theirs.error)


@pytest.mark.parametrize("name", list(ANSWERS))
async def test_the_same_answer_is_the_same_attempt(name: str) -> None:
    answer = ANSWERS[name]
    srv = RawServer(lambda n, _: answer)
    try:
        ours, theirs = await _attempts(srv.url)
    finally:
        srv.close()
    _same(ours, theirs)
    if name[0].isdigit():
        assert ours.status == int(name[:3])
    if name in ("closed-without-answer", "not-http"):
        assert ours.error == theirs.error


async def test_a_refused_connection_is_the_same_attempt() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    ours, theirs = await _attempts(url)
    _same(ours, theirs)
    assert ours.retry and ours.status is None and (ours.error or "").startswith("ConnectError: ")


async def test_no_answer_in_time_is_the_same_attempt() -> None:
    def late(n: int, _: bytes) -> bytes:
        time.sleep(1.5)
        return ANSWERS["200"] or b""

    srv = RawServer(late)
    try:
        ours, theirs = await _attempts(srv.url, timeout_s=0.5)
    finally:
        srv.close()
    _same(ours, theirs)
    assert ours.retry and ours.error is not None and ours.error.startswith("no answer within 0.5 s")
