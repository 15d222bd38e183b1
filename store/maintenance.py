"""Maintenance: storage health and statistics, giving free pages back
(vacuum), the page counts, and rebuilding the projections.

A role of :class:`store.eventstore.EventStore` (its methods keep their
names there)."""

from __future__ import annotations

from typing import Any

import aiosqlite

from store._core import (
    StoreCore,
    log,
)
from store.projections import Projector
from store.types import (
    StoreStatistics,
)

__all__ = ["Maintenance"]


class Maintenance(StoreCore):
    """Maintenance: storage health and statistics, giving free pages back
    (vacuum), the page counts, and rebuilding the projections."""

    def storage_problem(self) -> dict[str, Any] | None:
        """What keeps the store from writing right now, or None while writes
        succeed: ``{"kind": "locked"|"disk full"|"I/O error", "message": str,
        "since": RFC 3339 UTC, "waiting": appends held for retry}``. Set by a
        failed write, cleared by the next commit."""
        problem = self._writer.problem
        return None if problem is None else problem.to_json()

    def storage_incidents(self) -> tuple[int, dict[str, Any] | None]:
        """How many storage troubles have started since the store opened,
        and the last one that ended: ``{"kind", "message", "since",
        "resumed_at", "attempts"}`` (None before any). An appender compares
        the count before and after its append to learn that it waited."""
        return self._writer.incidents, self._writer.last_incident

    def statistics(self) -> StoreStatistics:
        """The store's counters since it opened (see :class:`StoreStatistics`);
        read from memory, so cheap enough for every health check."""
        waiters, waited_runs = self._subs.counts()
        return StoreStatistics(
            last_seq=self._subs.published_seq,
            transactions=self._writer.transactions,
            reads=self._reads,
            waiters=waiters,
            waited_runs=waited_runs,
            storage_incidents=self._writer.incidents,
        )

    async def vacuum_step(self, pages: int = 2048) -> int:
        """Give up to ``pages`` free database pages back to the file system
        (``PRAGMA incremental_vacuum``: one short write transaction between
        append batches), then checkpoint the WAL so the file shrinks.
        Returns the free pages left (call again while > 0)."""
        self._check_open()

        async def step(conn: aiosqlite.Connection) -> int:
            # executescript steps the statement to its end: a plain execute
            # runs one step of the pragma, which frees a single page.
            await conn.executescript(f"PRAGMA incremental_vacuum({int(pages)});")
            rows = list(await conn.execute_fetchall("PRAGMA freelist_count"))
            left = int(rows[0][0])
            if left == 0:
                # Copy the WAL back and reset it, so the file shrinks now (a
                # reader still on an old snapshot only makes this partial).
                await conn.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
            return left

        return int(await self._writer.exclusive(step))

    async def database_pages(self) -> dict[str, int]:
        """``{"page_size", "page_count", "freelist_count"}`` of the database."""
        out = {}
        for name in ("page_size", "page_count", "freelist_count"):
            rows = await self._read(f"PRAGMA {name}")
            out[name] = int(rows[0][0])
        return out

    async def rebuild(self) -> None:
        """Drop the projection tables and replay the whole event log into
        them, in one transaction between append batches (readers keep seeing
        the old rows until it commits). Raises StorageFullError,
        StoreClosedError."""
        self._check_open()
        projector = Projector()

        async def run(conn: aiosqlite.Connection) -> int:
            await conn.execute("BEGIN IMMEDIATE")
            try:
                count = await projector.rebuild(conn)
                await conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    await conn.execute("ROLLBACK")
                raise
            return count

        count = await self._writer.exclusive(run)
        log.info("store.rebuilt", path=str(self.path), events=count)
