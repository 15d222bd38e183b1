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
by one batch while the next one was committing finds that one there (and a
waiter on runs none of those events belongs to learns it from one dict
look-up per run). Events appended by another process on the same file are not
published here; when a local batch reveals such a gap in seq, every waiter
is woken to re-read the database instead.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import heapq
from collections.abc import Sequence
from typing import Any, Final

from store.types import LOG_LINES, RecordedEvent

__all__ = ["RECENT_EVENTS", "RECENT_LOG_LINES", "Subscriptions", "Waiter"]

#: How many recently published events are kept to answer re-checks...
RECENT_EVENTS: Final = 2048
#: ...as long as they hold at most this many log lines (a memory bound).
RECENT_LOG_LINES: Final = 50_000
#: Deadlines are kept in ticks of this many seconds (a wait times out up to one tick late, never early).
DEADLINE_TICK_S: Final = 0.01


class Waiter:
    """One registered wait. ``woken`` (an asyncio future: the cheapest thing
    to wake a thousand waiters with) completes when ``result`` got the
    matching published events (seq order, at most ``limit``), when
    ``reread`` asks the waiter to re-query the database instead, when
    ``closed`` says the store closed, or when its deadline passed (none of
    these set). ``registered`` is False once a publish or :meth:`Subscriptions.unregister`
    took it out of the registry."""

    __slots__ = (
        "_pending",
        "after_seq",
        "closed",
        "due",
        "limit",
        "registered",
        "reread",
        "result",
        "run_ids",
        "types",
        "woken",
    )

    def __init__(
        self,
        after_seq: int,
        run_ids: frozenset[str] | None,
        types: frozenset[str] | None,
        limit: int,
        woken: asyncio.Future[None],
    ) -> None:
        self.after_seq = after_seq
        self.run_ids = run_ids
        self.types = types
        self.limit = limit
        self.woken = woken
        self.result: list[RecordedEvent] | None = None
        self.reread = False
        self.closed = False
        self.registered = False
        self.due: int | None = None  # the deadline tick, while it has one
        self._pending: list[RecordedEvent] | None = None

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

    Deadlines (:meth:`wake_at`) are grouped in ticks of
    :data:`DEADLINE_TICK_S`, and one loop timer is set for the earliest
    tick that still has a waiter: a thousand waiters with a timeout cost a
    dict entry each, not a ``loop.call_at`` (and its cancellation) each.
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
        # Each run's last published seq, for the runs with events in the window.
        self._run_last: dict[str, int] = {}
        # Deadline tick -> the waiters due then; a heap of the ticks (some
        # may have lost their waiters); the one timer and the tick it is for.
        self._due: dict[int, dict[Waiter, None]] = {}
        self._due_ticks: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_tick: int | None = None

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
        if run_ids is not None:
            run_last = self._run_last
            for run_id in run_ids:
                if run_last.get(run_id, 0) > after_seq:
                    break
            else:
                return []  # none of the runs has an event after after_seq
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
        run_last = self._run_last
        if gap:
            self._recent.clear()
            self._recent_events = self._recent_lines = 0
            run_last.clear()
        lines = sum(_line_weight(e.data) for e in events if e.type == LOG_LINES)
        self._recent.append(_Batch(events, by_run, lines))
        self._recent_events += len(events)
        self._recent_lines += lines
        for run_id, run_events in by_run.items():
            run_last[run_id] = run_events[-1].seq
        while self._recent and (
            self._recent_events > self.max_recent_events or self._recent_lines > self.max_recent_lines
        ):
            oldest = self._recent.popleft()
            self._recent_events -= len(oldest.events)
            self._recent_lines -= oldest.lines
            for run_id, run_events in oldest.by_run.items():
                if run_last.get(run_id) == run_events[-1].seq:  # its last event leaves the window
                    del run_last[run_id]

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
            return waiter
        waiter.registered = True
        if run_ids is None:
            self._any_run.add(waiter)
        else:
            by_run = self._by_run
            for run_id in run_ids:
                waiters = by_run.get(run_id)
                if waiters is None:
                    by_run[run_id] = {waiter}
                else:
                    waiters.add(waiter)
        return waiter

    def wake_at(self, waiter: Waiter, deadline: float) -> None:
        """Wake ``waiter`` (with no result: timed out) at ``deadline`` (on
        the running loop's clock; up to one tick later), unless something
        woke it before; :meth:`unregister` drops the deadline."""
        tick = int(deadline / DEADLINE_TICK_S) + 1
        bucket = self._due.get(tick)
        if bucket is None:
            self._due[tick] = bucket = {}
            heapq.heappush(self._due_ticks, tick)
            if self._timer_tick is None or tick < self._timer_tick:
                self._arm()
        bucket[waiter] = None
        waiter.due = tick

    def _arm(self) -> None:
        """Set the timer for the earliest tick that has waiters (none if no tick has)."""
        ticks = self._due_ticks
        while ticks and ticks[0] not in self._due:
            heapq.heappop(ticks)
        tick = ticks[0] if ticks else None
        if tick == self._timer_tick:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_tick = tick
        self._timer = None if tick is None else asyncio.get_running_loop().call_at(tick * DEADLINE_TICK_S, self._expire)

    def _expire(self) -> None:
        """The timer: wake the waiters of every tick that passed, then set
        the timer for the next tick."""
        fired = self._timer_tick
        self._timer = self._timer_tick = None
        now = int(asyncio.get_running_loop().time() / DEADLINE_TICK_S)
        last = now if fired is None else max(now, fired)
        ticks = self._due_ticks
        while ticks and ticks[0] <= last:
            for waiter in self._due.pop(heapq.heappop(ticks), ()):
                waiter.due = None
                waiter.wake()
        self._arm()

    def counts(self) -> tuple[int, int]:
        """``(waiters, runs)``: the waiters registered now, and how many
        distinct runs the run-filtered ones name."""
        by_run = {w for ws in self._by_run.values() for w in ws}
        return len(self._any_run) + len(by_run), len(self._by_run)

    def unregister(self, waiter: Waiter) -> None:
        """Forget ``waiter`` and its deadline (idempotent; cheap when a
        publish already took it out of the registry)."""
        if waiter.due is not None:
            tick, waiter.due = waiter.due, None
            bucket = self._due.get(tick)
            if bucket is not None:
                bucket.pop(waiter, None)
                if not bucket:
                    del self._due[tick]
                    if tick == self._timer_tick:
                        self._arm()
        if not waiter.registered:
            return
        waiter.registered = False
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

        Call only after the batch's COMMIT returned. One pass: a waiter on
        one run gets its events (a fresh list) and is woken as its run's
        events are matched; its run's set is dropped whole when every
        waiter in it woke. Waiters on several runs collect theirs first.
        """
        if not events:
            return
        gap = events[0].seq != self.published_seq + 1
        self.published_seq = max(self.published_seq, events[-1].seq)
        by_run: dict[str, list[RecordedEvent]] = {}
        for event in events:
            run_events = by_run.get(event.run_id)
            if run_events is None:
                by_run[event.run_id] = [event]
            else:
                run_events.append(event)
        self._remember(events, by_run, gap)
        if gap:  # another process appended in between: let everyone re-read
            for waiter in [*self._any_run, *(w for ws in self._by_run.values() for w in ws)]:
                waiter.reread = True
                self._wake(waiter)
            return
        registry = self._by_run
        several: list[Waiter] = []
        for run_id, run_events in by_run.items():
            waiters = registry.get(run_id)
            if waiters is None:
                continue
            first_seq = run_events[0].seq
            woke: list[Waiter] = []
            for waiter in waiters:
                run_ids, types, after_seq = waiter.run_ids, waiter.types, waiter.after_seq
                if types is None and after_seq < first_seq:
                    matched = run_events[: waiter.limit]
                else:
                    matched = [e for e in run_events if e.seq > after_seq and (types is None or e.type in types)]
                if not matched:
                    continue
                if run_ids is not None and len(run_ids) > 1:
                    if waiter._pending is None:
                        waiter._pending = matched
                        several.append(waiter)
                    else:
                        waiter._pending.extend(matched)
                    continue
                waiter.result = matched if len(matched) <= waiter.limit else matched[: waiter.limit]
                waiter.registered = False
                woke.append(waiter)
                if not waiter.woken.done():
                    waiter.woken.set_result(None)
            if len(woke) == len(waiters):
                del registry[run_id]
            else:
                for waiter in woke:
                    waiters.discard(waiter)
        if self._any_run:
            woke = []
            for waiter in self._any_run:
                matched = []
                for event in events:
                    if waiter.matches(event):
                        matched.append(event)
                        if len(matched) >= waiter.limit:
                            break
                if matched:
                    waiter.result = matched
                    woke.append(waiter)
            for waiter in woke:
                self._wake(waiter)
        for waiter in several:
            pending = waiter._pending
            assert pending is not None
            pending.sort(key=_seq_of)
            waiter.result = pending[: waiter.limit]
            waiter._pending = None
            self._wake(waiter)

    def close(self) -> None:
        """Wake every waiter with ``closed`` set; later registrations are
        returned closed."""
        self._closed = True
        for waiter in [*self._any_run, *(w for ws in self._by_run.values() for w in ws)]:
            waiter.closed = True
            self._wake(waiter)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_tick = None
        self._due.clear()
        self._due_ticks.clear()


def _seq_of(event: RecordedEvent) -> int:
    return event.seq


def _line_weight(data: dict[str, Any]) -> int:
    """How many lines a LogLines event accounts for (schema 3: a count; schema 2: its pairs)."""
    lines = data.get("lines")
    return len(lines) if isinstance(lines, list) else int(data.get("line_count") or 0)
