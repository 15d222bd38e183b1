"""A fault-injecting wrapper of the event store, for tests of the store's
users: every attribute is the real :class:`~store.EventStore`'s, and
:meth:`FaultyStore.fail` makes the next calls of one method raise a given
error (disk full, database locked, store closed...) before they reach the
store, so nothing of them is recorded -- as the store promises for those
errors."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from store import EventStore

__all__ = ["FaultyStore"]


class FaultyStore:
    """``real`` with faults on call. Use it where an EventStore is taken
    (``cast(EventStore, FaultyStore(real))``); ``calls`` counts the calls of
    each method that went through it."""

    def __init__(self, real: EventStore) -> None:
        self.real = real
        self.calls: dict[str, int] = {}
        self._faults: dict[str, list[BaseException]] = {}

    def fail(self, method: str, error: BaseException, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise ``error``."""
        if not callable(getattr(self.real, method, None)):
            raise AttributeError(f"EventStore has no method {method!r}")
        self._faults.setdefault(method, []).extend([error] * times)

    def clear(self) -> None:
        """Remove every fault not yet raised."""
        self._faults.clear()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr) or name.startswith("__"):
            return attr
        return self._wrap(name, attr)

    def _wrap(self, name: str, attr: Callable[..., Any]) -> Callable[..., Any]:
        def check() -> None:
            self.calls[name] = self.calls.get(name, 0) + 1
            pending = self._faults.get(name)
            if pending:
                raise pending.pop(0)

        if name == "subscribe":  # an async generator function: fails on its first step

            @functools.wraps(attr)
            async def agen(*args: Any, **kwargs: Any) -> Any:
                check()
                async for item in attr(*args, **kwargs):
                    yield item

            return agen

        import inspect

        if inspect.iscoroutinefunction(attr):

            @functools.wraps(attr)
            async def coro(*args: Any, **kwargs: Any) -> Any:
                check()
                return await attr(*args, **kwargs)

            return coro

        @functools.wraps(attr)
        def plain(*args: Any, **kwargs: Any) -> Any:
            check()
            return attr(*args, **kwargs)

        return plain
