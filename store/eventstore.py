"""The event store facade: :class:`EventStore`, composed of its roles
(:mod:`store.eventlog`, :mod:`store.runqueries`, :mod:`store.logreading`,
:mod:`store.archiving`, :mod:`store.maintenance`) over one
:class:`~store._core.StoreCore`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import TracebackType
from typing import Self, get_args

import aiosqlite
import anyio

from store._core import (
    _READERS,
    LogArchive,
    LogReplay,
    log,
)
from store.archiving import LogArchiving
from store.eventlog import EventLog
from store.logreading import LogReading
from store.maintenance import Maintenance
from store.projections import Projector
from store.runqueries import RunQueries
from store.schema import Synchronous, open_connection
from store.subscriptions import RECENT_EVENTS, Subscriptions
from store.writer import Writer

__all__ = ["EventStore", "LogArchive", "LogReplay"]


class EventStore(EventLog, RunQueries, LogReading, LogArchiving, Maintenance):
    """An append-only event log with projections and subscriptions, in one
    SQLite file (WAL mode).

    Use ``store = await EventStore.open(path)`` ... ``await store.close()``,
    or ``async with await EventStore.open(path) as store:``. Runs on anyio's
    asyncio backend (the writer is an asyncio task). One process should own
    a database at a time; a second process on the same file is safe (its
    writes wait for the lock, up to ``busy_timeout_s``), but its events wake
    this process's waiters only at this process's next commit.

    Attributes: ``path`` (the database file, absolute).
    """

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout_s: float = 5.0,
        commit_window_s: float = 0.002,
        archive_dir: str | os.PathLike[str] | None = None,
        recent_events: int = RECENT_EVENTS,
    ) -> EventStore:
        """Open the database at ``path`` (creating it and its folder if
        missing), apply forward migrations and start the writer task.

        ``synchronous``: SQLite's ``PRAGMA synchronous`` in WAL mode
        (https://sqlite.org/pragma.html#pragma_synchronous) -- ``FULL``
        (default) syncs the WAL at every commit, so an append that returned
        survives power loss; ``NORMAL`` may lose the last commits on power
        loss (never on a process crash); ``OFF`` is for tests and benchmarks. ``busy_timeout_s``: how long a
        write waits for another process's lock before
        :class:`StoreLockedError`. ``commit_window_s``: how long the writer
        keeps collecting appends into one transaction (0 = only what is
        already queued). ``archive_dir``: where retention puts archived log
        text (default: ``archive`` beside the database). ``recent_events``:
        how many just-published events are kept in memory to answer a
        waiter's re-check without a query (0 = always query).

        Raises NotADatabaseError (not SQLite or corrupt), SchemaTooNewError
        (from a newer jobsup), StoreOpenError (an SQLite file that is not
        jobsup's, unreadable), StoreLockedError; the file is left untouched
        by all but the last. ValueError for a bad argument.
        """
        if synchronous not in get_args(Synchronous):
            raise ValueError(f"synchronous must be one of {', '.join(get_args(Synchronous))}, got {synchronous!r}")
        if not busy_timeout_s >= 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        if not 0 <= commit_window_s <= 1:
            raise ValueError(f"commit_window_s must be within 0..1 s, got {commit_window_s!r}")
        if recent_events < 0:
            raise ValueError(f"recent_events must be >= 0, got {recent_events!r}")
        db_path = Path(path).absolute()  # noqa: ASYNC240 - once at open, before any reader exists
        db_path.parent.mkdir(parents=True, exist_ok=True)
        archive_dir = Path(archive_dir).absolute() if archive_dir is not None else None  # noqa: ASYNC240 - once at open
        writer_conn = await open_connection(
            db_path, synchronous=synchronous, busy_timeout_s=busy_timeout_s, writer=True, rebuild=Projector().rebuild
        )
        readers: list[aiosqlite.Connection] = []
        try:
            for _ in range(_READERS):  # one at a time: each is appended before the next can fail
                readers.append(  # noqa: PERF401 - on failure the ones already open are closed below
                    await open_connection(db_path, synchronous=synchronous, busy_timeout_s=busy_timeout_s, writer=False)
                )
            rows = list(await writer_conn.execute_fetchall("SELECT COALESCE(MAX(seq), 0) FROM events"))
        except BaseException:
            for conn in [writer_conn, *readers]:
                await conn.close()
            raise
        subs = Subscriptions(published_seq=int(rows[0][0]), max_recent_events=recent_events)
        writer = Writer(
            writer_conn, db_path, subscriptions=subs, commit_window_s=commit_window_s, busy_timeout_s=busy_timeout_s
        )
        store = cls(db_path, writer_conn, readers, writer, subs, busy_timeout_s, archive_dir)
        store._writer_task = asyncio.get_running_loop().create_task(writer.run(), name=f"jobsup-store-writer {db_path}")
        log.info("store.opened", path=str(db_path), synchronous=synchronous, last_seq=subs.published_seq)
        return store

    async def close(self) -> None:
        """Finish the queued appends, stop the writer and close the database.

        Idempotent. Waiters in :meth:`wait_for_events` / :meth:`subscribe`
        then raise :class:`StoreClosedError`, as do later calls.
        """
        async with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()
            try:
                task = self._writer_task
                if task is not None:
                    with anyio.CancelScope(shield=True):
                        await asyncio.wait([task])  # the queued appends finish; raises nothing
                    if not task.cancelled() and task.exception() is not None:
                        log.error("store.writer_failed_before_close", path=str(self.path), error=repr(task.exception()))
            finally:
                self._subs.close()
                with anyio.CancelScope(shield=True):
                    for conn in [*self._readers, self._writer_conn]:
                        await conn.close()
                log.info("store.closed", path=str(self.path))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
