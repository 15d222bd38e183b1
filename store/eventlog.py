"""The event log: append (events, log blocks, checkpoints), read, wait and
subscribe; the checkpoints of subscribers.

A role of :class:`store.eventstore.EventStore` (its methods keep their
names there)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from store._core import (
    _EVENT_COLUMNS,
    StoreCore,
    _check_checkpoint,
    _event_from_row,
    _frozen,
    _placeholders,
    _prepare,
)
from store.errors import StoreClosedError, StoreError
from store.logblocks import LogBlock
from store.types import (
    LOG_LINES,
    Append,
    Checkpoint,
    NewEvent,
    RecordedEvent,
)
from store.writer import PreparedEvent

__all__ = ["EventLog"]


class EventLog(StoreCore):
    """The event log: append (events, log blocks, checkpoints), read, wait and
    subscribe; the checkpoints of subscribers."""

    async def append(
        self,
        run_id: str,
        expected_version: int | None,
        events: Sequence[NewEvent],
        *,
        checkpoint: Checkpoint | None = None,
        wait_for_storage: bool = False,
    ) -> list[RecordedEvent]:
        """Append ``events`` to the stream of ``run_id``, which must be at
        ``expected_version`` (0 = the stream does not exist yet; None = at
        the end of an existing stream, whatever its version: for recorders
        such as hooks whose events do not depend on the stream's state).
        ``checkpoint`` (a subscriber's position) moves forward in the same
        transaction, only if these events are recorded.

        Returns the recorded events (seq, version 1-based per run, ``at``:
        the UTC time their transaction began, shared by the whole batch)
        only after their transaction's COMMIT returned, i.e. durably with
        ``synchronous=FULL``; subscribers have been woken by then. Concurrent
        appends are grouped into one transaction; each succeeds or fails on
        its own.

        Raises ConcurrencyError (stale ``expected_version``; nothing
        written), StorageFullError (disk full; nothing written, the store
        works again once space returns), StoreLockedError (another process
        held the lock past the busy timeout), StoreClosedError; ValueError
        for bad input (empty ``events``, a data shape that breaks
        :mod:`store.types`, data that is not JSON-serialisable), naming the
        run, type and key. Cancelling the caller does not withdraw a queued
        append.

        ``wait_for_storage=True``: storage trouble (a lock held by another
        process, a full disk, an I/O error) does not raise; the append is
        retried with back-off until written (see :mod:`store.writer`), and
        :meth:`storage_problem` says what it waits for. It still raises
        ConcurrencyError, ValueError, and StoreClosedError once the store
        closes.
        """
        self._check_open()
        prepared = _prepare(run_id, expected_version, events, checkpoint)
        return await self._writer.append(
            run_id, expected_version, prepared, checkpoint, wait_for_storage=wait_for_storage
        )

    async def append_many(self, appends: Sequence[Append]) -> list[list[RecordedEvent] | StoreError]:
        """Several appends, to any streams, queued together in this order:
        each is what :meth:`append` does with the same arguments (its
        checkpoint moves with its own events) and succeeds or fails on its
        own, but the caller waits once for all of them, and appends queued
        together share a transaction unless the batch is full. For a
        recorder with many small appends at once (hooks' outcome events).

        Returns, per append in order, its recorded events (after their
        COMMIT returned) or the StoreError it failed with (ConcurrencyError,
        StorageFullError, StoreLockedError, StoreClosedError, StoreError):
        one failing append does not fail the others, and a later append
        may be recorded although an earlier one failed. Raises ValueError
        for bad input (as :meth:`append`; nothing queued) and
        StoreClosedError when the store is closed. Cancelling the caller
        does not withdraw the queued appends."""
        self._check_open()
        jobs = [
            (a.run_id, a.expected_version, _prepare(a.run_id, a.expected_version, a.events, a.checkpoint), a.checkpoint)
            for a in appends
        ]
        return await self._writer.append_many(jobs)

    async def append_together(self, appends: Sequence[Append]) -> list[list[RecordedEvent]]:
        """Several appends to distinct streams, all or nothing: one
        transaction, in this order, with consecutive seqs (a sweep and its
        runs). Returns, per append, its recorded events. Raises
        ConcurrencyError when any stream is not at its expected version
        (nothing written), the storage errors of :meth:`append`, ValueError
        for bad input (as :meth:`append`, or a stream named twice).
        Checkpoints are not taken here."""
        self._check_open()
        if len({a.run_id for a in appends}) != len(appends):
            raise ValueError("append_together: a stream is named twice")
        if any(a.checkpoint is not None for a in appends):
            raise ValueError("append_together: checkpoints are not taken here")
        jobs = [(a.run_id, a.expected_version, _prepare(a.run_id, a.expected_version, a.events, None)) for a in appends]
        return await self._writer.append_together(jobs)

    async def append_log(
        self,
        run_id: str,
        expected_version: int | None,
        blocks: Sequence[LogBlock],
        *,
        wait_for_storage: bool = False,
    ) -> list[RecordedEvent]:
        """Append one ``LogLines`` event per block of ``blocks`` to the
        stream of ``run_id`` (at ``expected_version``; None = at the end of
        the existing stream, as for :meth:`append`), in one transaction:
        each records only its lines past the newest recorded position of its
        source (:mod:`store.logblocks`). Returns the recorded events (their
        data is the audit record of :data:`store.types.LOG_LINES`; a block
        of nothing new still records an event with ``line_count`` 0).

        ``wait_for_storage`` as for :meth:`append`. Raises what
        :meth:`append` raises; ValueError for a malformed block.
        """
        self._check_open()
        if not blocks:
            raise ValueError(f"run {run_id}: append_log needs at least one block")
        prepared = []
        for block in blocks:
            block.validate(run_id)
            prepared.append(PreparedEvent(LOG_LINES, "", {}, 1 + len(block.text) // 128, block))
        return await self._writer.append(run_id, expected_version, prepared, wait_for_storage=wait_for_storage)

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Move ``checkpoint.name`` forward to ``checkpoint.seq`` (a smaller
        seq than the stored one changes nothing), in its own transaction
        (grouped with concurrent appends). For a subscriber that went past
        events it had nothing to record for. Raises StorageFullError,
        StoreLockedError, StoreClosedError; ValueError for a bad checkpoint."""
        self._check_open()
        _check_checkpoint(checkpoint)
        await self._writer.append("", None, [], checkpoint)

    async def checkpoints(self) -> dict[str, int]:
        """Every stored checkpoint: subscriber name -> seq."""
        rows = await self._read("SELECT name, seq FROM checkpoints ORDER BY name")
        return {str(r[0]): int(r[1]) for r in rows}

    async def get_checkpoint(self, name: str) -> int | None:
        """The stored seq of subscriber ``name``, or None if it has none."""
        rows = await self._read("SELECT seq FROM checkpoints WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else None

    async def read_stream(self, run_id: str, from_version: int = 1) -> list[RecordedEvent]:
        """The events of ``run_id`` with version >= ``from_version``, in
        version order ([] for an unknown run). Raises StoreClosedError."""
        rows = await self._read(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE run_id = ? AND version >= ? ORDER BY version",
            (run_id, from_version),
        )
        return [_event_from_row(r) for r in rows]

    async def read_all(
        self,
        after_seq: int = 0,
        limit: int = 1000,
        run_id: str | None = None,
        types: Collection[str] | None = None,
    ) -> list[RecordedEvent]:
        """One page of the global log: up to ``limit`` events with seq >
        ``after_seq`` (optionally only of ``run_id`` and of ``types``), in
        seq order. Page on with ``after_seq = page[-1].seq``."""
        return await self._query_events(
            after_seq, limit, None if run_id is None else frozenset({run_id}), _frozen(types, "types")
        )

    async def read_recent(
        self,
        before_seq: int | None = None,
        limit: int = 100,
        run_id: str | None = None,
        types: Collection[str] | None = None,
        exclude_types: Collection[str] | None = None,
    ) -> list[RecordedEvent]:
        """One page of the global log read backwards: up to ``limit`` events
        with seq < ``before_seq`` (None: the newest), optionally only of
        ``run_id``, only of ``types`` and none of ``exclude_types``, newest
        first. Page on with ``before_seq = page[-1].seq``. Raises ValueError
        for ``limit`` <= 0."""
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit!r}")
        only, without = _frozen(types, "types"), _frozen(exclude_types, "exclude_types")
        where: list[str] = []
        params: list[Any] = []
        if before_seq is not None:
            where.append("seq < ?")
            params.append(before_seq)
        order = "seq DESC"
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
            order = "version DESC"  # the same order within a run, along the (run_id, version) index
        if only is not None:
            if not only:
                return []
            where.append(f"type IN ({_placeholders(len(only))})")
            params.extend(sorted(only))
        if without:
            where.append(f"type NOT IN ({_placeholders(len(without))})")
            params.extend(sorted(without))
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = await self._read(
            f"SELECT {_EVENT_COLUMNS} FROM events {clause}ORDER BY {order} LIMIT ?", (*params, limit)
        )
        return [_event_from_row(r) for r in rows]

    async def _query_events(
        self, after_seq: int, limit: int, run_ids: frozenset[str] | None, types: frozenset[str] | None
    ) -> list[RecordedEvent]:
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit!r}")
        where: list[str] = ["seq > ?"]
        params: list[Any] = [after_seq]
        order = "seq"
        if run_ids is not None:
            if not run_ids:
                return []
            where.append(f"run_id IN ({_placeholders(len(run_ids))})")
            params.extend(sorted(run_ids))
            if len(run_ids) == 1:
                order = "version"  # the same order within a run, and it follows the (run_id, version) index
        if types is not None:
            if not types:
                return []
            where.append(f"type IN ({_placeholders(len(types))})")
            params.extend(sorted(types))
        rows = await self._read(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY {order} LIMIT ?",
            (*params, limit),
        )
        return [_event_from_row(r) for r in rows]

    @property
    def published_seq(self) -> int:
        """The highest seq committed and published to this store's waiters
        (no query): every event up to it is one :meth:`wait_for_events`
        returns. Events another process appended on the same file count
        once this store's next commit published them; :meth:`last_seq`
        reads the file."""
        return self._subs.published_seq

    async def last_seq(self) -> int:
        """The highest seq in the log (0 when empty)."""
        rows = await self._read("SELECT COALESCE(MAX(seq), 0) FROM events")
        return int(rows[0][0])

    async def event_times(self, seqs: Collection[int]) -> dict[int, str]:
        """``{seq: at}`` of the events ``seqs`` (those that exist)."""
        if not seqs:
            return {}
        rows = await self._read(
            "SELECT e.seq, e.at FROM json_each(?) AS j JOIN events AS e ON e.seq = j.value",
            (json.dumps(sorted(seqs)),),
        )
        return {int(r[0]): str(r[1]) for r in rows}

    async def wait_for_events(
        self,
        after_seq: int,
        *,
        run_ids: Collection[str] | None = None,
        types: Collection[str] | None = None,
        limit: int = 1000,
        timeout_s: float | None = None,
    ) -> list[RecordedEvent]:
        """Wait for events with seq > ``after_seq`` (of ``run_ids`` and
        ``types`` if given; None = any) and return up to ``limit`` of them in
        seq order: at once if some are already committed, else as soon as a
        commit adds some; [] after ``timeout_s`` seconds (None = no timeout).

        Race-free: the wait is registered before the log is re-checked, and
        commits notify only after COMMIT returned, so an event committed at
        any moment after ``after_seq`` is returned. No polling. Raises
        StoreClosedError (also when the store closes while waiting).
        """
        self._check_open()
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit!r}")
        want_runs, want_types = _frozen(run_ids, "run_ids"), _frozen(types, "types")
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        subs = self._subs
        while True:
            waiter = subs.register(after_seq, want_runs, want_types, limit)
            try:
                if waiter.closed:
                    raise StoreClosedError(f"{self.path}: the store is closed")
                found = None if waiter.reread else subs.recent(after_seq, want_runs, want_types, limit)
                if found is None:
                    found = await self._query_events(after_seq, limit, want_runs, want_types)
                if found:
                    return found
                if not waiter.woken.done():
                    if deadline is not None:
                        if timeout_s is not None and timeout_s <= 0:
                            return []  # nothing now, and no time to wait
                        subs.wake_at(waiter, deadline)  # wakes it with no result: timed out
                    await waiter.woken
                if waiter.closed:
                    raise StoreClosedError(f"{self.path}: the store was closed while waiting")
                if waiter.result:
                    return waiter.result
                if not waiter.reread:  # timed out
                    return []
                # another process appended: loop to query the database
            finally:
                subs.unregister(waiter)

    async def subscribe(
        self,
        after_seq: int,
        *,
        run_ids: Collection[str] | None = None,
        types: Collection[str] | None = None,
    ) -> AsyncIterator[RecordedEvent]:
        """Every matching event with seq > ``after_seq``, in seq order, as
        committed, forever (bound it with a cancel scope). Built on
        :meth:`wait_for_events`; raises StoreClosedError when the store
        closes."""
        cursor = after_seq
        while True:
            for event in await self.wait_for_events(cursor, run_ids=run_ids, types=types):
                cursor = event.seq
                yield event
