"""Seq-cursor waits: wake callers when events past their cursor are committed.

A caller waiting for "the next event with seq > N (for these runs, of these
types)" registers a :class:`Waiter` *first*, then re-checks the database,
then sleeps on the waiter. The writer calls :meth:`Subscriptions.publish`
with each batch only after its COMMIT returned, handing the matching events
straight to the waiters (no query, no polling). So an event committed
between the caller's read and its sleep still wakes it:

* committed before the waiter was registered: the re-check read sees it;
* committed after: its publish (which follows its COMMIT) finds the waiter.

The re-check needs no database read when ``N`` is at or past the newest
published seq (every event with seq > N is still to be published, and will
be to this waiter), nor when the recently published events, kept in memory
(:data:`RECENT_EVENTS` at most), cover every seq after ``N``: a waiter woken
by one batch while the next one was committing finds that one there. Events appended by another process on the same file are not
published here; when a local batch reveals such a gap in seq, every waiter
is woken to re-read the database instead.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, Final

from store.types import LOG_LINES, RecordedEvent

__all__ = ["RECENT_EVENTS", "RECENT_LOG_LINES", "Subscriptions", "Waiter"]

#: How many recently published events are kept to answer re-checks...
RECENT_EVENTS: Final = 2048
#: ...as long as they hold at most this many log lines (a memory bound).
RECENT_LOG_LINES: Final = 50_000


@dataclasses.dataclass(eq=False, slots=True)
class Waiter:
    """One registered wait. ``woken`` (an asyncio future: the cheapest thing
    to wake a thousand waiters with) completes when ``result`` got the
    matching published events (seq order, at most ``limit``), when
    ``reread`` asks the waiter to re-query the database instead, or when
    ``closed`` says the store closed."""

    after_seq: int
    run_ids: frozenset[str] | None
    types: frozenset[str] | None
    limit: int
    woken: asyncio.Future[None]
    result: list[RecordedEvent] | None = None
    reread: bool = False
    closed: bool = False
    _pending: list[RecordedEvent] = dataclasses.field(default_factory=list)

    def wake(self) -> None:
        """Complete ``woken`` (once; a cancelled wait stays cancelled)."""
        if not self.woken.done():
            self.woken.set_result(None)

    def matches(self, event: RecordedEvent) -> bool:
        """True if ``event`` is one this waiter waits for."""
        return (
            event.seq > self.after_seq
            and (self.run_ids is None or event.run_id in self.run_ids)
            and (self.types is None or event.type in self.types)
        )


@dataclasses.dataclass(slots=True)
class _Batch:
    """One published batch, kept to answer :meth:`Subscriptions.recent`."""

    events: Sequence[RecordedEvent]
    by_run: dict[str, list[RecordedEvent]]
    lines: int


class Subscriptions:
    """The registry of waiters. Not thread-safe: used from the event loop only.

    ``published_seq`` is the highest seq known committed and published (the
    store's last seq when it opened, then each published batch's last). The
    last ``max_recent_events`` published events (holding at most
    ``max_recent_lines`` log lines) are kept to answer :meth:`recent`.
    """

    def __init__(
        self, published_seq: int, max_recent_events: int = RECENT_EVENTS, max_recent_lines: int = RECENT_LOG_LINES
    ) -> None:
        self.published_seq = published_seq
        self.max_recent_events = max_recent_events
        self.max_recent_lines = max_recent_lines
        self._by_run: dict[str, set[Waiter]] = {}
        self._any_run: set[Waiter] = set()
        self._closed = False
        # The last published batches, contiguous in seq up to published_seq.
        self._recent: collections.deque[_Batch] = collections.deque()
        self._recent_events = 0
        self._recent_lines = 0

    def recent(
        self, after_seq: int, run_ids: frozenset[str] | None, types: frozenset[str] | None, limit: int
    ) -> list[RecordedEvent] | None:
        """The published events with seq > ``after_seq`` matching the
        filters (at most ``limit``, seq order) if the in-memory window holds
        every seq from ``after_seq + 1`` to ``published_seq``; else None
        (ask the database)."""
        if after_seq >= self.published_seq:
            return []
        if not self._recent or self._recent[0].events[0].seq > after_seq + 1:
            return None
        newest_first: list[list[RecordedEvent]] = []
        for batch in reversed(self._recent):
            if batch.events[-1].seq <= after_seq:
                break
            if run_ids is None:
                candidates: Sequence[RecordedEvent] = batch.events
            elif len(run_ids) == 1:
                candidates = batch.by_run.get(next(iter(run_ids)), ())
            else:
                candidates = sorted((e for r in run_ids for e in batch.by_run.get(r, ())), key=lambda e: e.seq)
            newest_first.append([e for e in candidates if e.seq > after_seq and (types is None or e.type in types)])
        return [e for found in reversed(newest_first) for e in found][:limit]

    def _remember(self, events: Sequence[RecordedEvent], by_run: dict[str, list[RecordedEvent]], gap: bool) -> None:
        if gap:
            self._recent.clear()
            self._recent_events = self._recent_lines = 0
        lines = sum(_line_weight(e.data) for e in events if e.type == LOG_LINES)
        self._recent.append(_Batch(events, by_run, lines))
        self._recent_events += len(events)
        self._recent_lines += lines
        while self._recent and (
            self._recent_events > self.max_recent_events or self._recent_lines > self.max_recent_lines
        ):
            oldest = self._recent.popleft()
            self._recent_events -= len(oldest.events)
            self._recent_lines -= oldest.lines

    def register(
        self, after_seq: int, run_ids: frozenset[str] | None, types: frozenset[str] | None, limit: int
    ) -> Waiter:
        """Register a waiter for events with seq > ``after_seq`` matching the
        filters (``None`` = any). If the registry is closed, the waiter is
        returned already woken with ``closed`` set."""
        waiter = Waiter(after_seq, run_ids, types, limit, asyncio.get_running_loop().create_future())
        if self._closed:
            waiter.closed = True
            waiter.wake()
        elif run_ids is None:
            self._any_run.add(waiter)
        else:
            for run_id in run_ids:
                self._by_run.setdefault(run_id, set()).add(waiter)
        return waiter

    def counts(self) -> tuple[int, int]:
        """``(waiters, runs)``: the waiters registered now, and how many
        distinct runs the run-filtered ones name."""
        by_run = {w for ws in self._by_run.values() for w in ws}
        return len(self._any_run) + len(by_run), len(self._by_run)

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
        waiter.wake()

    def publish(self, events: Sequence[RecordedEvent]) -> None:
        """Hand a just-committed batch (seq order) to the waiters it matches.

        Call only after the batch's COMMIT returned.
        """
        if not events:
            return
        gap = events[0].seq != self.published_seq + 1
        self.published_seq = max(self.published_seq, events[-1].seq)
        by_run: dict[str, list[RecordedEvent]] = {}
        for event in events:
            by_run.setdefault(event.run_id, []).append(event)
        self._remember(events, by_run, gap)
        if gap:  # another process appended in between: let everyone re-read
            for waiter in [*self._any_run, *(w for ws in self._by_run.values() for w in ws)]:
                waiter.reread = True
                self._wake(waiter)
            return
        touched: set[Waiter] = set()
        for run_id, run_events in by_run.items():
            if run_id in self._by_run:
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


def _line_weight(data: dict[str, Any]) -> int:
    """How many lines a LogLines event accounts for (schema 3: a count; schema 2: its pairs)."""
    lines = data.get("lines")
    return len(lines) if isinstance(lines, list) else int(data.get("line_count") or 0)
