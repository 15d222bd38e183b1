"""A real local HTTP server receiving webhooks, for the hook tests: it
records every request (headers, body, arrival time) and answers from a
script of responses (status, headers, an optional hold until released)."""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
from collections.abc import Callable
from typing import Any, Self

__all__ = ["Received", "Reply", "WebhookServer"]


@dataclasses.dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when the body was read
    peer: tuple[str, int] = ("", 0)  # the client's address: one per connection

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclasses.dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b"ok"
    hold: threading.Event | None = None  # answer only once this is set


class WebhookServer:
    """``with WebhookServer() as srv:`` ... ``srv.url``; ``srv.replies`` is
    consumed first-in first-out per request (then ``default`` answers);
    ``srv.received`` lists every request; ``srv.arrived`` is set on each."""

    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply()
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.on_request: Callable[[Received], None] | None = None
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                got = Received(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time(), self.client_address
                )
                with server.lock:
                    server.received.append(got)
                    reply = server.replies.pop(0) if server.replies else server.default
                    server.arrived.notify_all()
                if server.on_request is not None:
                    server.on_request(got)
                if reply.hold is not None:
                    reply.hold.wait(120)
                try:
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/hook/s3cr3t-path"

    def wait_for(self, n: int, timeout: float = 30.0) -> list[Received]:
        """Block until ``n`` requests arrived; returns them all."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while len(self.received) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.received)} webhook requests arrived, expected {n}")
                self.arrived.wait(left)
            return list(self.received)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
