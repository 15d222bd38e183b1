"""Seq-cursor waits: wake callers when events past their cursor are committed.

A caller waiting for "the next event with seq > N (for these runs, of these
types)" registers a :class:`Waiter` *first*, then re-checks the database,
then sleeps on the waiter. The writer calls :meth:`Subscriptions.publish`
with each batch only after its COMMIT returned, handing the matching events
straight to the waiters (no query, no polling). So an event committed
between the caller's read and its sleep still wakes it:

* committed before the waiter was registered: the re-check read sees it;
* committed after: its publish (which follows its COMMIT) finds the waiter.

The re-check read is skipped when ``N`` is at or past the newest published
seq: then every event with seq > N is still to be published, and will be to
this waiter. Events appended by another process on the same file are not
published here; when a local batch reveals such a gap in seq, every waiter
is woken to re-read the database instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import anyio

from store.types import RecordedEvent

__all__ = ["Subscriptions", "Waiter"]


@dataclasses.dataclass(eq=False, slots=True)
class Waiter:
    """One registered wait. ``result`` gets the matching published events
    (seq order, at most ``limit``); ``reread`` asks the waiter to re-query the
    database instead; ``closed`` says the store closed."""

    after_seq: int
    run_ids: frozenset[str] | None
    types: frozenset[str] | None
    limit: int
    woken: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: list[RecordedEvent] | None = None
    reread: bool = False
    closed: bool = False
    _pending: list[RecordedEvent] = dataclasses.field(default_factory=list)

    def matches(self, event: RecordedEvent) -> bool:
        """True if ``event`` is one this waiter waits for."""
        return (
            event.seq > self.after_seq
            and (self.run_ids is None or event.run_id in self.run_ids)
            and (self.types is None or event.type in self.types)
        )


class Subscriptions:
    """The registry of waiters. Not thread-safe: used from the event loop only.

    ``published_seq`` is the highest seq known committed and published (the
    store's last seq when it opened, then each published batch's last).
    """

    def __init__(self, published_seq: int) -> None:
        self.published_seq = published_seq
        self._by_run: dict[str, set[Waiter]] = {}
        self._any_run: set[Waiter] = set()
        self._closed = False

    def register(
        self, after_seq: int, run_ids: frozenset[str] | None, types: frozenset[str] | None, limit: int
    ) -> Waiter:
        """Register a waiter for events with seq > ``after_seq`` matching the
        filters (``None`` = any). If the registry is closed, the waiter is
        returned already woken with ``closed`` set."""
        waiter = Waiter(after_seq, run_ids, types, limit)
        if self._closed:
            waiter.closed = True
            waiter.woken.set()
        elif run_ids is None:
            self._any_run.add(waiter)
        else:
            for run_id in run_ids:
                self._by_run.setdefault(run_id, set()).add(waiter)
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        """Forget ``waiter`` (idempotent)."""
        if waiter.run_ids is None:
            self._any_run.discard(waiter)
            return
        for run_id in waiter.run_ids:
            waiters = self._by_run.get(run_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._by_run[run_id]

    def _wake(self, waiter: Waiter) -> None:
        self.unregister(waiter)
        waiter.woken.set()

    def publish(self, events: Sequence[RecordedEvent]) -> None:
        """Hand a just-committed batch (seq order) to the waiters it matches.

        Call only after the batch's COMMIT returned.
        """
        if not events:
            return
        gap = events[0].seq != self.published_seq + 1
        self.published_seq = max(self.published_seq, events[-1].seq)
        if gap:  # another process appended in between: let everyone re-read
            for waiter in [*self._any_run, *(w for ws in self._by_run.values() for w in ws)]:
                waiter.reread = True
                self._wake(waiter)
            return
        touched: set[Waiter] = set()
        if self._by_run:
            by_run: dict[str, list[RecordedEvent]] = {}
            for event in events:
                if event.run_id in self._by_run:
                    by_run.setdefault(event.run_id, []).append(event)
            for run_id, run_events in by_run.items():
                for waiter in self._by_run[run_id]:
                    matched = [e for e in run_events if waiter.matches(e)]
                    if matched:
                        waiter._pending.extend(matched)
                        touched.add(waiter)
        for waiter in self._any_run:
            matched = []
            for event in events:
                if waiter.matches(event):
                    matched.append(event)
                    if len(matched) >= waiter.limit:
                        break
            if matched:
                waiter._pending.extend(matched)
                touched.add(waiter)
        for waiter in touched:
            pending = waiter._pending
            if waiter.run_ids is not None and len(waiter.run_ids) > 1:
                pending.sort(key=lambda e: e.seq)
            waiter.result = pending[: waiter.limit]
            waiter._pending = []
            self._wake(waiter)

    def close(self) -> None:
        """Wake every waiter with ``closed`` set; later registrations are
        returned closed."""
        self._closed = True
        for waiter in [*self._any_run, *(w for ws in self._by_run.values() for w in ws)]:
            waiter.closed = True
            self._wake(waiter)
