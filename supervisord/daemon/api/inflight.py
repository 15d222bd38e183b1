"""Requests the API is still handling when the daemon stops.

A stop closes the listener, ends the open streams (:mod:`.streams`), then
gives the requests still being handled (a submit snapshotting a big
repository, a cancel waiting for its job to stop, a prune) a grace period
to finish and answer. Those still running after it are cancelled and
answered ``503`` with a :class:`~supervisord.shared.exceptions.DaemonStoppingError`
(a DaemonUnreachableError to clients: a submit then looks its run up by
request id on the next daemon, a read retries there) instead of uvicorn's
plain ``500 Internal Server Error`` and a traceback in the daemon log.
"""

from __future__ import annotations

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from supervisord.shared.exceptions import DaemonStoppingError
from supervisord.shared.wire import to_wire

__all__ = ["InFlight"]


class InFlight:
    """ASGI middleware over the API: each HTTP request runs in a cancel
    scope known here until its handler and response are done (a stream
    until it ends), so that :meth:`drain` can let them finish, then cancel
    the rest. A request cancelled before its response started is answered
    with DaemonStoppingError (HTTP 503); one whose response had started
    (a stream) just ends, as a stream does when the daemon goes away."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._scopes: set[anyio.CancelScope] = set()
        #: Set when the last request ends while :meth:`drain` waits.
        self._idle: anyio.Event | None = None

    @property
    def count(self) -> int:
        """How many requests are being handled now."""
        return len(self._scopes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        cancel = anyio.CancelScope()
        self._scopes.add(cancel)
        try:
            with cancel:
                await self.app(scope, receive, send_tracked)
        finally:
            self._scopes.discard(cancel)
            if not self._scopes and self._idle is not None:
                self._idle.set()
        if cancel.cancelled_caught and not started:
            what = f"{scope.get('method', '')} {scope.get('path', '')}".strip()
            status, body = to_wire(
                DaemonStoppingError(
                    f"the daemon stopped before it finished this request ({what}); what it had done stays"
                    " recorded: check with `jobsup runs` or `jobsup show` once a daemon is back"
                )
            )
            await JSONResponse(body, status_code=status)(scope, receive, send)

    async def drain(self, grace_s: float) -> int:
        """Wait until no request is being handled, for at most ``grace_s``
        seconds; then cancel the ones left. Returns how many were
        cancelled. Call it once the listener is closed (no new requests)."""
        if self._scopes:
            self._idle = anyio.Event()
            with anyio.move_on_after(grace_s):
                await self._idle.wait()
        left = list(self._scopes)
        for scope in left:
            scope.cancel()
        return len(left)
