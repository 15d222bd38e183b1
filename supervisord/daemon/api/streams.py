"""Ending the daemon's open streams when it stops.

A ``logs -f``, ``events -f`` or ``wait`` stream (and the web page's live
updates) waits for events for as long as its client listens. When the
daemon stops, uvicorn closes its listener and gives open requests
``timeout_graceful_shutdown`` seconds before it cancels them, logging
each cancelled one as an "Exception in ASGI application" with a
traceback: a routine stop would read as a failure. :class:`StreamCloser`
ends every open stream first, cleanly (the response's last chunk is
sent, the connection closes): clients take a stream that ends without
its last object for a daemon that went away, and reconnect (README,
"Commands"), so they lose nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import TypeVar

import anyio

__all__ = ["StreamCloser"]

T = TypeVar("T")


class StreamCloser:
    """Every stream it :meth:`guard`\\ s ends once :meth:`close_all` is
    called (on the daemon's event loop), also while it waits for its next
    item; streams guarded after that end at once."""

    def __init__(self) -> None:
        self.closing = False
        self._waiting: set[anyio.CancelScope] = set()

    def close_all(self) -> None:
        """End every guarded stream now, and every one guarded later."""
        self.closing = True
        for scope in list(self._waiting):
            scope.cancel()

    async def guard(self, body: AsyncIterable[T]) -> AsyncIterator[T]:
        """The items of ``body`` until it ends or the streams are closed;
        then ``body`` is closed (its ``aclose``) and this ends without an
        error. Each wait for an item runs in its own cancel scope (none
        spans a ``yield``), which :meth:`close_all` cancels."""
        items = aiter(body)
        try:
            while not self.closing:
                scope = anyio.CancelScope()
                self._waiting.add(scope)
                try:
                    with scope:
                        item = await anext(items)
                except StopAsyncIteration:
                    return
                finally:
                    self._waiting.discard(scope)
                if scope.cancel_called:
                    return
                yield item
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
