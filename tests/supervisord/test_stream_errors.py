"""An error in a stream after its headers went out (``logs``, ``events``,
``wait``) reaches the client as that error, with its message and exit code,
not as a lost daemon: an NDJSON stream ends with an error record; a
plain-text log stream is cut, and the client asks where it was cut."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from store.errors import StorageFullError
from supervisord.shared import exceptions as exc
from supervisord.shared.wire import error_record, from_wire, to_wire
from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = pytest.mark.timeout(120)


# -- the daemon's side ---------------------------------------------------------


class _Event:
    def __init__(self, seq: int) -> None:
        self.seq = seq

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "run_id": "abcd12345678", "type": "Submitted", "data": {}}


def _events_body(failure: Exception) -> list[Any]:
    """The NDJSON lines of ``GET /v1/events`` over a store whose second
    page of events raises ``failure``."""
    from starlette.testclient import TestClient

    from supervisord.daemon.api.server import create_app

    class Store:
        pages = 0

        async def read_all(self, after: int, **kwargs: Any) -> list[_Event]:
            self.pages += 1
            if self.pages > 1:
                raise failure
            return [_Event(after + 1)]

    async def doctor() -> list[dict[str, Any]]:
        return []

    app = create_app(supervisor=None, planner=None, store=Store(), info={}, doctor=doctor)  # type: ignore[arg-type]
    with TestClient(app) as http:
        resp = http.get("/v1/events", params={"limit": 1})
    assert resp.status_code == 200
    return [json.loads(line) for line in resp.text.splitlines()]


def test_a_store_error_in_the_events_stream_ends_it_with_an_error_record() -> None:
    lines = _events_body(StorageFullError("database or disk is full"))
    assert lines[0]["seq"] == 1
    record = lines[-1]
    assert len(lines) == 2 and record["status"] == 503, lines
    err = from_wire(record["status"], record)
    assert type(err) is exc.StorageError and err.store_error == "StorageFullError"
    assert "database or disk is full" in str(err)


def test_a_bug_in_the_events_stream_ends_it_with_an_internal_error_record() -> None:
    lines = _events_body(RuntimeError("boom"))
    assert lines[-1]["status"] == 500 and lines[-1]["error"]["type"] == "InternalError", lines


# -- the client's side: a scripted daemon on the socket ---------------------------


def _chunked(*chunks: bytes, end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return body + (b"0\r\n\r\n" if end else b"")


def _head(status: int, content_type: str, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n{extra}"
        "Connection: close\r\n\r\n"
    ).encode()


def _json_answer(status: int, body: Any) -> bytes:
    payload = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + payload


def _serve(path: Path, answer: Callable[[str], bytes]) -> None:
    """A daemon on ``path`` answering ``/v1/health`` and, for any other
    request, ``answer(request line)`` (then closing the connection)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    srv.settimeout(60)

    def run() -> None:
        with srv:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn:
                    line = conn.recv(65536).split(b"\r\n", 1)[0].decode()
                    if " /v1/health " in line:
                        conn.sendall(_json_answer(200, {"ok": True}))
                    else:
                        conn.sendall(answer(line))

    threading.Thread(target=run, daemon=True).start()


STORAGE = exc.StorageError(
    "the jobsup daemon's event store failed: database or disk is full (free space and retry)",
    store_error="StorageFullError",
)


def _record(err: Exception) -> bytes:
    return json.dumps(error_record(err)).encode() + b"\n"


def test_cli_events_prints_the_streams_error_and_exits_1(js: JobsupEnv) -> None:
    event = json.dumps(_Event(1).to_json()).encode() + b"\n"
    _serve(js.socket, lambda line: _head(200, "application/x-ndjson") + _chunked(event, _record(STORAGE)))
    r = js.cli("events", "-o", "json", check=False)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [f"error: {STORAGE}"]
    assert [json.loads(line)["seq"] for line in r.stdout.splitlines()] == [1]


def test_cli_wait_prints_the_streams_error_and_exits_1(js: JobsupEnv) -> None:
    stream = b'{"after": 5}\n{"heartbeat": 5}\n' + _record(STORAGE)
    _serve(js.socket, lambda line: _head(200, "application/x-ndjson") + _chunked(stream))
    r = js.cli("wait", "abcd1234", check=False)
    assert r.returncode == 1, r.stderr
    assert f"error: {STORAGE}" in r.stderr.splitlines() and "lost" not in r.stderr, r.stderr


def test_cli_logs_text_cut_off_asks_where_and_prints_the_error(js: JobsupEnv) -> None:
    damaged = exc.LogsDamagedError("run abcd12345678: its log archive /s/archive/x.jslog is missing")
    asked: list[str] = []

    def answer(line: str) -> bytes:
        asked.append(line)
        if "format=blocks" in line:
            status, body = to_wire(damaged)
            return _json_answer(status, body)
        # Two whole lines and half a third, then the body is cut off.
        return _head(200, "text/plain; charset=utf-8", "X-Jobsup-First-Line: 1\r\n") + _chunked(
            b"one\ntwo\nthr", end=False
        )

    _serve(js.socket, answer)
    r = js.cli("logs", "abcd1234", check=False)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [f"error: {damaged}"], r.stderr
    assert r.stdout.startswith("one\ntwo\n")
    assert "after_line=2" in asked[-1], asked


def test_cli_logs_text_cut_off_by_a_daemon_that_is_gone_is_a_lost_daemon(js: JobsupEnv) -> None:
    served = {"n": 0}

    def answer(line: str) -> bytes:
        served["n"] += 1
        if served["n"] > 1:
            return b""  # the daemon went away: the connection closes unanswered
        return _head(200, "text/plain; charset=utf-8", "X-Jobsup-First-Line: 1\r\n") + _chunked(b"one\n", end=False)

    _serve(js.socket, answer)
    r = js.cli("logs", "abcd1234", check=False)
    assert r.returncode == 69, r.stderr
    assert "lost the jobsup daemon" in r.stderr
