"""The event store facade: :class:`EventStore`."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar, get_args

import aiosqlite
import anyio
import structlog

from store import archive as arc
from store.errors import LogArchiveError, LogTextDeletedError, StoreClosedError, StoreError
from store.logblocks import LogBlock, block_lines, lines_after
from store.projections import RUN_COLUMNS, Projector, run_status_from_row, validate_event
from store.schema import Synchronous, open_connection, translate_error
from store.subscriptions import RECENT_EVENTS, Subscriptions
from store.types import (
    LOG_LINES,
    LOGS_ARCHIVED,
    LOGS_DELETED,
    TERMINAL_PHASES,
    Append,
    Checkpoint,
    LogLine,
    NewEvent,
    RecordedEvent,
    RunStatus,
    StoreStatistics,
)
from store.writer import PreparedEvent, Writer


def _unlink_durably(path: Path) -> None:
    path.unlink(missing_ok=True)
    arc.forget_reader(path)
    if path.parent.is_dir():
        arc.fsync_dir(path.parent)


__all__ = ["EventStore", "LogArchive", "LogReplay"]

log = structlog.get_logger("store")

_T = TypeVar("_T")
#: One replay's archive readers (``replay`` of :meth:`EventStore.log_text`,
#: :meth:`EventStore.log_lines`): archive path -> the reader its first page
#: verified; start each replay with an empty dict.
LogReplay = dict[Path, arc.ArchiveReader]
_READERS: Final = 2
_EVENT_COLUMNS: Final = "seq, run_id, version, type, at, data"
#: Blocks read from the database per step while a run is archived (each up to 8 MiB).
_ARCHIVE_READ_BLOCKS: Final = 2
_BLOCK_ROW: Final = "first_line, lines, seq, stream, source, first_pos, last_pos, start, positions, bytes, text"


@dataclasses.dataclass(frozen=True, slots=True)
class LogArchive:
    """Where a run's archived log text is (one ``log_archives`` row):
    lines 1..``lines`` are in ``file`` (a name in the archive folder) whose
    sha256 is ``sha256``; ``deleted_at``/``deleted_seq`` once retention
    deleted it (``LogsDeleted``)."""

    run_id: str
    file: str
    sha256: str
    lines: int
    bytes: int
    archived_seq: int
    archived_at: str
    deleted_seq: int | None
    deleted_at: str | None

    def to_json(self) -> dict[str, Any]:
        """A plain dict with the same keys."""
        return dataclasses.asdict(self)


def _fault(step: str) -> None:
    """Fault injection for the crash tests: ``JOBSUP_FAULT_ARCHIVE=<step>``
    kills this process (SIGKILL) when archiving reaches ``step``
    (``writing``: the text is in the temporary ``.partial`` file, its
    index not yet; ``renamed``: the file is complete and in place, its
    event not recorded; ``committed``: the event recorded, the database
    not yet vacuumed)."""
    if os.environ.get("JOBSUP_FAULT_ARCHIVE") == step:
        log.warning("store.fault_injected", step=step)
        os.kill(os.getpid(), signal.SIGKILL)


def _event_from_row(row: Sequence[Any]) -> RecordedEvent:
    return RecordedEvent(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))


def _frozen(values: Collection[str] | None, what: str) -> frozenset[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise TypeError(f"{what} must be a collection of str, not a str ({values!r})")
    return frozenset(values)


def _check_checkpoint(checkpoint: Checkpoint) -> None:
    if not isinstance(checkpoint, Checkpoint) or not isinstance(checkpoint.name, str) or not checkpoint.name:
        raise ValueError(f"checkpoint must be a Checkpoint with a non-empty name, got {checkpoint!r}")
    if not isinstance(checkpoint.seq, int) or isinstance(checkpoint.seq, bool) or checkpoint.seq < 0:
        raise ValueError(f"checkpoint {checkpoint.name}: seq must be an int >= 0, got {checkpoint.seq!r}")


def _prepare(
    run_id: str, expected_version: int | None, events: Sequence[NewEvent], checkpoint: Checkpoint | None
) -> list[PreparedEvent]:
    """Check the arguments of one append (ValueError naming the run, type
    and key at fault) and serialise its events."""
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"run_id must be a non-empty str, got {run_id!r}")
    if expected_version is not None and (
        not isinstance(expected_version, int) or isinstance(expected_version, bool) or expected_version < 0
    ):
        raise ValueError(f"run {run_id}: expected_version must be an int >= 0 or None, got {expected_version!r}")
    if checkpoint is not None:
        _check_checkpoint(checkpoint)
    if not events:
        raise ValueError(f"run {run_id}: append needs at least one event")
    prepared = []
    for event in events:
        validate_event(run_id, event)
        try:
            data_json = json.dumps(event.data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            data_json.encode()  # a lone surrogate cannot be stored as UTF-8
        except (TypeError, ValueError) as exc:
            raise ValueError(f"run {run_id}: {event.type} data is not JSON-serialisable: {exc}") from exc
        if event.type == LOG_LINES:
            block = LogBlock.from_pairs(event.data["stream"], event.data["source"], event.data["lines"])
            prepared.append(PreparedEvent(event.type, "", {}, 1 + len(event.data["lines"]), block))
            continue
        prepared.append(PreparedEvent(event.type, data_json, json.loads(data_json), 1))
    return prepared


def _placeholders(n: int) -> str:
    return ", ".join("?" * n)


class EventStore:
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

    def __init__(
        self,
        path: Path,
        writer_conn: aiosqlite.Connection,
        readers: list[aiosqlite.Connection],
        writer: Writer,
        subscriptions: Subscriptions,
        busy_timeout_s: float,
        archive_dir: Path | None = None,
    ) -> None:
        self.path = path
        #: Where archived log text goes (retention): one file per run.
        self.archive_dir = archive_dir if archive_dir is not None else path.parent / "archive"
        # Archiving and cleaning the archive folder never overlap; file work
        # (compression, hashing) runs in worker threads, one at a time.
        self._archive_lock = anyio.Lock()
        self._archive_limiter = anyio.CapacityLimiter(1)
        self._read_limiter = anyio.CapacityLimiter(2)
        self._writer_conn = writer_conn
        self._readers = readers
        self._next_reader = itertools.cycle(readers)
        self._writer = writer
        self._subs = subscriptions
        self._busy_timeout_s = busy_timeout_s
        self._reads = 0  # queries run on the read connections (statistics())
        self._writer_task: asyncio.Task[None] | None = None
        self._closed = False
        self._close_lock = anyio.Lock()

    # -- lifecycle ----------------------------------------------------------

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
        db_path = Path(path).absolute()
        db_path.parent.mkdir(parents=True, exist_ok=True)
        archive_dir = Path(archive_dir).absolute() if archive_dir is not None else None
        writer_conn = await open_connection(
            db_path, synchronous=synchronous, busy_timeout_s=busy_timeout_s, writer=True, rebuild=Projector().rebuild
        )
        readers: list[aiosqlite.Connection] = []
        try:
            for _ in range(_READERS):
                readers.append(
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

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path}: the store is closed")

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Run one query on a read connection; rows as tuples."""
        self._check_open()
        self._reads += 1
        try:
            return list(await next(self._next_reader).execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise translate_error(exc, self.path, self._busy_timeout_s) from exc
        except ValueError as exc:  # aiosqlite: "Connection closed"
            raise StoreClosedError(f"{self.path}: the store is closed") from exc

    # -- the event log -----------------------------------------------------------

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

    # -- subscriber checkpoints ----------------------------------------------------

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

    # -- projections ------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunStatus | None:
        """The run-status projection of ``run_id`` (exact id), or None."""
        rows = await self._read(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return run_status_from_row(rows[0]) if rows else None

    async def get_runs(self, run_ids: Collection[str]) -> dict[str, RunStatus]:
        """The run-status projections of those of ``run_ids`` (exact ids)
        that exist, in one query: run id -> RunStatus."""
        ids = sorted(set(run_ids))
        if not ids:
            return {}
        rows = await self._read(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)
        )
        return {status.id: status for status in map(run_status_from_row, rows)}

    async def first_events(self, run_ids: Collection[str]) -> dict[str, RecordedEvent]:
        """The first event (version 1: the Submitted event) of each of
        ``run_ids`` that has one, in one query: run id -> RecordedEvent."""
        ids = sorted(set(run_ids))
        if not ids:
            return {}
        rows = await self._read(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE version = 1 AND run_id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),),
        )
        return {event.run_id: event for event in map(_event_from_row, rows)}

    async def list_runs(
        self,
        *,
        project: str | None = None,
        phases: Collection[str] | None = None,
        non_terminal_only: bool = False,
        name: str | None = None,
        log_ingest: str | None = None,
    ) -> list[RunStatus]:
        """Runs matching every given filter, newest (latest Submitted) first
        (``log_ingest``: only runs whose ``log_ingest`` is that value)."""
        where: list[str] = []
        params: list[Any] = []
        if project is not None:
            where.append("project = ?")
            params.append(project)
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if log_ingest is not None:
            where.append("log_ingest = ?")
            params.append(log_ingest)
        wanted = _frozen(phases, "phases")
        if wanted is not None:
            if not wanted:
                return []
            where.append(f"phase IN ({_placeholders(len(wanted))})")
            params.extend(sorted(wanted))
        if non_terminal_only:
            where.append(f"phase NOT IN ({_placeholders(len(TERMINAL_PHASES))})")
            params.extend(sorted(TERMINAL_PHASES))
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = await self._read(f"SELECT {RUN_COLUMNS} FROM runs{clause} ORDER BY created_seq DESC", params)
        return [run_status_from_row(r) for r in rows]

    async def page_runs(
        self,
        *,
        limit: int,
        before: int | None = None,
        project: str | None = None,
        phases: Collection[str] | None = None,
        name: str | None = None,
        backend: str | None = None,
    ) -> tuple[list[RunStatus], int | None]:
        """One page of runs, newest first: up to ``limit`` runs submitted
        before the cursor ``before`` (None = the newest), matching every given
        filter. Returns the page and the cursor of the next (older) page, or
        None when this page is the last. Reads only the page's rows (the
        ``runs_by_created`` index), whatever the number of runs."""
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit!r}")
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("project", project), ("name", name), ("backend", backend)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        wanted = _frozen(phases, "phases")
        if wanted is not None:
            if not wanted:
                return [], None
            where.append(f"phase IN ({_placeholders(len(wanted))})")
            params.extend(sorted(wanted))
        if before is not None:
            where.append("created_seq < ?")
            params.append(before)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = await self._read(
            f"SELECT {RUN_COLUMNS}, created_seq FROM runs{clause} ORDER BY created_seq DESC LIMIT ?",
            (*params, limit + 1),
        )
        page = [run_status_from_row(r[:-1]) for r in rows[:limit]]
        cursor = int(rows[limit - 1][-1]) if len(rows) > limit else None
        return page, cursor

    async def sweep_runs(self, sweep_id: str) -> list[RunStatus]:
        """The runs of sweep ``sweep_id`` (exact id), in sweep index order."""
        rows = await self._read(
            f"SELECT {RUN_COLUMNS} FROM runs JOIN run_meta AS j ON j.run_id = runs.id"
            " WHERE j.sweep_id = ? ORDER BY j.sweep_index, runs.created_seq",
            (sweep_id,),
        )
        return [run_status_from_row(r) for r in rows]

    async def sweep_table(self, sweep_id: str) -> list[dict[str, Any]]:
        """The runs of sweep ``sweep_id`` as its results table needs them,
        in sweep index order, in one query (no full run objects): ``{"id",
        "name", "phase", "reason", "exit_code", "params", "progress",
        "started_at", "ended_at"}`` (times: the ``at`` of the run's first
        RUNNING and of its terminal PhaseChanged, None when none yet)."""
        terminal = ", ".join(f"'{p}'" for p in sorted(TERMINAL_PHASES))
        rows = await self._read(
            "SELECT r.id, r.name, r.phase, r.reason, r.exit_code, m.params, m.progress,"
            " (SELECT MIN(e.at) FROM events AS e WHERE e.run_id = r.id AND e.type = 'PhaseChanged'"
            "  AND json_extract(e.data, '$.phase') = 'RUNNING'),"
            f" CASE WHEN r.phase IN ({terminal}) THEN (SELECT MAX(e.at) FROM events AS e WHERE e.run_id = r.id"
            f"  AND e.type = 'PhaseChanged' AND json_extract(e.data, '$.phase') IN ({terminal})) END"
            " FROM run_meta AS m JOIN runs AS r ON r.id = m.run_id WHERE m.sweep_id = ?"
            " ORDER BY m.sweep_index, r.created_seq",
            (sweep_id,),
        )
        return [
            {
                "id": r[0],
                "name": r[1],
                "phase": r[2],
                "reason": r[3],
                "exit_code": r[4],
                "params": json.loads(r[5]) if r[5] else {},
                "progress": json.loads(r[6]) if r[6] else None,
                "started_at": r[7],
                "ended_at": r[8],
            }
            for r in rows
        ]

    async def match_sweep_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` sweep ids starting with ``prefix`` (non-empty), sorted."""
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = await self._read(
            "SELECT DISTINCT sweep_id FROM run_meta WHERE sweep_id >= ? AND sweep_id < ? ORDER BY sweep_id LIMIT ?",
            (prefix, upper, limit),
        )
        return [str(r[0]) for r in rows]

    async def match_run_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` run ids starting with ``prefix``, sorted."""
        if not prefix:
            rows = await self._read("SELECT id FROM runs ORDER BY id LIMIT ?", (limit,))
        else:
            upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            rows = await self._read(
                "SELECT id FROM runs WHERE id >= ? AND id < ? ORDER BY id LIMIT ?", (prefix, upper, limit)
            )
        return [str(r[0]) for r in rows]

    async def log_lines(
        self, run_id: str, after_line: int = 0, limit: int = 10000, *, replay: LogReplay | None = None
    ) -> list[LogLine]:
        """Up to ``limit`` log lines of ``run_id`` with line_no >
        ``after_line``, in line_no order. Page on with ``page[-1].line_no``.
        Archived lines are read from their verified archive; raises
        LogArchiveError (archive missing or not the recorded file) and
        LogTextDeletedError (retention deleted the text). ``replay``: the
        pages of one replay share it (an empty dict at the start): every
        page after the first reads the archive through the descriptor the
        first verified, whatever happens to the path meanwhile."""
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit!r}")
        archive = await self.log_archive(run_id)
        if archive is not None and after_line < archive.lines:
            rows: list[Any] = []
            cursor, count = after_line, 0
            while count < limit:
                blocks = await self._archived_blocks(archive, cursor, _ARCHIVE_READ_BLOCKS, replay)
                if not blocks:
                    break
                for b in blocks:
                    rows.append((b[0], b[2], b[3], b[4], b[5], b[6], b[7], b[8]))
                    count += b[0] + b[1] - 1 - max(cursor, b[0] - 1)
                    cursor = b[0] + b[1] - 1
            return block_lines(run_id, rows, after_line, limit)
        # The blocks holding lines after_line+1 .. after_line+limit: from the one
        # that holds after_line+1 to the last one starting in that range.
        rows = await self._read(
            "SELECT first_line, seq, stream, source, first_pos, start, positions, text FROM log_blocks"
            " WHERE run_id = ?1 AND first_line <= ?2 + ?3 AND first_line + lines > ?2 + 1 AND first_line >= COALESCE(("
            "SELECT first_line FROM log_blocks WHERE run_id = ?1 AND first_line <= ?2 + 1"
            " ORDER BY first_line DESC LIMIT 1), 1) ORDER BY first_line",
            (run_id, after_line, limit),
        )
        return block_lines(run_id, rows, after_line, limit)

    async def log_text(
        self, run_id: str, after_line: int = 0, max_blocks: int = 8, *, replay: LogReplay | None = None
    ) -> tuple[int, bytes]:
        """The text of the lines of ``run_id`` numbered after ``after_line``,
        from at most ``max_blocks`` blocks, as one UTF-8 bytes object (every
        line ends with ``\n``), and the number of the last line it holds
        (``after_line`` when there is none yet). Page on with that number.
        For plain-text replay: no Python object per line. Archived lines
        come from their verified archive (errors and ``replay`` as
        :meth:`log_lines`)."""
        archive = await self.log_archive(run_id)
        rows: list[Any]
        if archive is not None and after_line < archive.lines:
            rows = [(b[0], b[1], b[8]) for b in await self._archived_blocks(archive, after_line, max_blocks, replay)]
        else:
            rows = await self._read(
                "SELECT first_line, lines, text FROM log_blocks WHERE run_id = ?1 AND first_line + lines > ?2 + 1"
                " AND first_line >= COALESCE(("
                "SELECT first_line FROM log_blocks WHERE run_id = ?1 AND first_line <= ?2 + 1"
                " ORDER BY first_line DESC LIMIT 1), 1) ORDER BY first_line LIMIT ?3",
                (run_id, after_line, max_blocks),
            )
        pieces: list[bytes] = []
        last = after_line
        for first_line, lines, text in rows:
            if first_line + lines - 1 <= after_line:
                continue
            if text is None:
                raise StoreError(f"{self.path}: run {run_id}: the text of lines {first_line}.. is not in the database")
            raw = bytes(text)
            if first_line <= after_line:
                raw = lines_after(raw, after_line + 1 - first_line, lines)
            pieces.append(raw)
            last = first_line + lines - 1
        return last, b"".join(pieces)

    async def event_times(self, seqs: Collection[int]) -> dict[int, str]:
        """``{seq: at}`` of the events ``seqs`` (those that exist)."""
        if not seqs:
            return {}
        rows = await self._read(
            "SELECT e.seq, e.at FROM json_each(?) AS j JOIN events AS e ON e.seq = j.value",
            (json.dumps(sorted(seqs)),),
        )
        return {int(r[0]): str(r[1]) for r in rows}

    async def tail_line_no(self, run_id: str, n: int) -> int:
        """The ``after_line`` for :meth:`log_lines` that yields the last
        ``n`` lines of ``run_id`` (0 when it has ``n`` lines or fewer)."""
        rows = await self._read(
            "SELECT MAX(COALESCE((SELECT first_line + lines - 1 FROM log_blocks WHERE run_id = ?1"
            " ORDER BY first_line DESC LIMIT 1), 0), COALESCE((SELECT lines FROM log_archives WHERE run_id = ?1), 0))",
            (run_id,),
        )
        return max(0, (int(rows[0][0]) if rows else 0) - max(0, n))

    async def last_log_position(self, run_id: str, source: str) -> str | None:
        """The ``pos`` of the newest recorded line of ``run_id`` from
        ``source`` (where a tailer resumes), or None if there is none."""
        rows = await self._read("SELECT pos FROM log_sources WHERE run_id = ? AND source = ?", (run_id, source))
        return str(rows[0][0]) if rows else None

    # -- retention: archived log text ---------------------------------------------

    async def log_archive(self, run_id: str) -> LogArchive | None:
        """Where the archived log text of ``run_id`` is, or None when none
        of its text was archived."""
        rows = await self._read(
            "SELECT run_id, file, sha256, lines, bytes, archived_seq, archived_at, deleted_seq, deleted_at"
            " FROM log_archives WHERE run_id = ?",
            (run_id,),
        )
        return LogArchive(*rows[0]) if rows else None

    async def log_text_bytes(self, run_id: str) -> int:
        """Bytes of log text ``run_id`` keeps in the database."""
        rows = await self._read("SELECT COALESCE(SUM(bytes), 0) FROM log_blocks WHERE run_id = ?", (run_id,))
        return int(rows[0][0])

    async def log_archives(self) -> list[LogArchive]:
        """Every ``log_archives`` row, by run id."""
        rows = await self._read(
            "SELECT run_id, file, sha256, lines, bytes, archived_seq, archived_at, deleted_seq, deleted_at"
            " FROM log_archives ORDER BY run_id"
        )
        return [LogArchive(*r) for r in rows]

    def archive_path(self, archive: LogArchive) -> Path:
        """The file of ``archive`` (refuses a name that leaves the archive folder)."""
        name = archive.file
        if "/" in name or name in ("", ".", "..") or "\0" in name:
            raise LogArchiveError(f"run {archive.run_id}: its LogsArchived event names a bad file {name!r}")
        return self.archive_dir / name

    async def _archived_blocks(
        self, archive: LogArchive, after_line: int, max_blocks: int, replay: LogReplay | None = None
    ) -> list[tuple[Any, ...]]:
        """Blocks of ``archive`` after ``after_line`` (see
        :meth:`store.archive.ArchiveReader.blocks`), read and verified in a
        worker thread; through ``replay``'s reader of the file when it
        holds one (else the one made is kept there)."""
        path = self.archive_path(archive)
        pinned = replay.get(path) if replay is not None else None
        if pinned is not None and pinned.run_id == archive.run_id:
            return await anyio.to_thread.run_sync(pinned.blocks, after_line, max_blocks, limiter=self._read_limiter)
        if archive.deleted_seq is not None:
            raise LogTextDeletedError(
                f"run {archive.run_id}: its log text (lines 1..{archive.lines}) was deleted at"
                f" {archive.deleted_at} by prune (LogsDeleted, event seq {archive.deleted_seq}, {archive.sha256});"
                f" it was archived at {archive.archived_at} as {archive.file}"
            )

        def read() -> list[tuple[Any, ...]]:
            reader = arc.archive_reader(path, archive.run_id, archive.sha256)
            if replay is not None:
                replay[path] = reader
            return reader.blocks(after_line, max_blocks)

        return await anyio.to_thread.run_sync(read, limiter=self._read_limiter)

    async def check_log_text(self, run_id: str, after_line: int = 0, *, replay: LogReplay | None = None) -> None:
        """Raise what reading the lines after ``after_line`` would raise
        (LogArchiveError, LogTextDeletedError) before a reply starts
        streaming them; checks the archive's digest (once per file
        version). ``replay``: the replay's reads go through the reader
        checked here (see :meth:`log_lines`)."""
        archive = await self.log_archive(run_id)
        if archive is not None and after_line < archive.lines:
            await self._archived_blocks(archive, after_line, 1, replay)

    async def archive_logs(self, run_id: str) -> RecordedEvent | None:
        """Move the log text of ``run_id`` out of the database into one
        compressed file (:mod:`store.archive`), keeping the audit trail:

        1. write ``<archive dir>/<run>.jslog.partial`` from the blocks (read
           in small steps; compression in a worker thread), fsync it;
        2. rename it to ``<run>.jslog``, fsync the folder;
        3. read it back from disk and check every block's text against the
           digest computed from the database;
        4. append ``LogsArchived`` (the file's sha256, line count...) and
           delete the archived block rows in that same transaction.

        A crash before step 4 commits leaves the text in the database (the
        next call writes the file again); after it, the text is in a
        verified file. Events are never changed. Returns the
        ``LogsArchived`` event, or None when the run has no text in the
        database or was archived already. The caller picks runs that are
        terminal and done ingesting. Raises LogArchiveError (verification
        failed: nothing removed), OSError (the archive folder), and what
        :meth:`append` raises.
        """
        self._check_open()
        async with self._archive_lock:
            if await self.log_archive(run_id) is not None:
                return None
            first = await self._read(
                "SELECT first_line FROM log_blocks WHERE run_id = ? ORDER BY first_line LIMIT 1", (run_id,)
            )
            if not first:
                return None
            final = self.archive_dir / f"{run_id}{arc.ARCHIVE_SUFFIX}"
            writer = await anyio.to_thread.run_sync(arc.ArchiveWriter, final, run_id, limiter=self._archive_limiter)
            digests: list[tuple[int, str]] = []
            blocks = 0
            try:
                cursor = 0
                while True:
                    rows = await self._read(
                        f"SELECT {_BLOCK_ROW} FROM log_blocks WHERE run_id = ? AND first_line > ?"
                        " ORDER BY first_line LIMIT ?",
                        (run_id, cursor, _ARCHIVE_READ_BLOCKS),
                    )
                    if not rows:
                        break
                    for r in rows:
                        if r[10] is None:
                            raise LogArchiveError(f"run {run_id}: lines {r[0]}.. have no text in the database")
                    block_rows: list[Any] = [tuple(r) for r in rows]
                    await anyio.to_thread.run_sync(writer.add, block_rows, limiter=self._archive_limiter)
                    blocks += len(rows)
                    cursor = int(rows[-1][0])
                digests = writer.digests()
                _fault("writing")
                sha256, size = await anyio.to_thread.run_sync(writer.finish, limiter=self._archive_limiter)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(writer.abort)
                raise
            _fault("renamed")
            await anyio.to_thread.run_sync(
                arc.verify_against, final, run_id, sha256, digests, limiter=self._archive_limiter
            )
            lines = writer.lines
            data = {"file": final.name, "sha256": sha256, "lines": lines, "bytes": writer.bytes,
                    "file_bytes": size, "blocks": blocks, "sources": writer.sources}  # fmt: skip

            async def drop_blocks(conn: aiosqlite.Connection) -> None:
                await conn.execute(
                    "DELETE FROM log_blocks WHERE run_id = ? AND first_line + lines - 1 <= ?", (run_id, lines)
                )

            data_json = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
            recorded = await self._writer.append(
                run_id, None, [PreparedEvent(LOGS_ARCHIVED, data_json, json.loads(data_json), 1)], effect=drop_blocks
            )
            log.info("store.logs_archived", run_id=run_id, lines=lines, bytes=writer.bytes, file_bytes=size)
            _fault("committed")
            return recorded[0]

    async def delete_archived_logs(self, run_id: str) -> RecordedEvent | None:
        """Delete the archived log text of ``run_id``: append
        ``LogsDeleted`` (the archive's file name, sha256 and line count),
        then remove the file and fsync the folder (a crash in between
        leaves a file :meth:`clean_archive_dir` removes). Returns the event,
        or None when the run has no archive or it is deleted already.

        The file is checked against the sha256 its ``LogsArchived`` event
        recorded first: a missing, unreadable or changed file is not
        deleted and nothing is recorded (LogArchiveError naming the file and
        both digests), so a ``LogsDeleted`` event never vouches for a digest
        the deleted file did not have, and the changed file stays for the
        operator to inspect."""
        self._check_open()
        async with self._archive_lock:
            archive = await self.log_archive(run_id)
            if archive is None or archive.deleted_seq is not None:
                return None
            path = await self._check_archive_before_delete(archive)
            data = {"file": archive.file, "sha256": archive.sha256, "lines": archive.lines}
            data_json = json.dumps(data, separators=(",", ":"))
            recorded = await self._writer.append(run_id, None, [PreparedEvent(LOGS_DELETED, data_json, data, 1)])
            await anyio.to_thread.run_sync(_unlink_durably, path)
            log.info("store.logs_deleted", run_id=run_id, file=archive.file, sha256=archive.sha256)
            return recorded[0]

    async def check_archive_before_delete(self, run_id: str) -> LogArchive | None:
        """What :meth:`delete_archived_logs` checks before it deletes, and
        nothing else (``prune --dry-run --delete-archives``): returns the
        run's archive, or None when it has none or it is deleted already.
        Raises LogArchiveError, with the very message the delete would
        raise, when the file is missing, unreadable or does not match the
        sha256 its ``LogsArchived`` event recorded."""
        self._check_open()
        async with self._archive_lock:
            archive = await self.log_archive(run_id)
            if archive is None or archive.deleted_seq is not None:
                return None
            await self._check_archive_before_delete(archive)
            return archive

    async def _check_archive_before_delete(self, archive: LogArchive) -> Path:
        """The path of ``archive``'s file once it is checked against its
        recorded sha256 (in a worker thread); LogArchiveError naming the
        file and both digests (or why it cannot be read) otherwise. The
        caller holds the archive lock."""
        run_id = archive.run_id
        path = self.archive_path(archive)
        try:
            actual = await anyio.to_thread.run_sync(arc.file_digest, path, limiter=self._archive_limiter)
        except FileNotFoundError:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} is missing (the LogsArchived event records"
                f" {archive.sha256}); not deleting: nothing was recorded"
            ) from None
        except arc.UntrustedFileError as exc:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} {exc} (it must be a regular file of yours that group"
                " and others cannot write); not deleting: nothing was recorded"
            ) from None
        except OSError as exc:
            raise LogArchiveError(
                f"run {run_id}: cannot read its log archive {path} to check it before deleting: {exc};"
                " not deleting: nothing was recorded"
            ) from exc
        if actual != archive.sha256:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} does not match the digest recorded when it was archived"
                f" ({archive.sha256}, the file is {actual}): the file was changed or damaged; not deleting it,"
                " nothing was recorded"
            )
        return path

    async def clean_archive_dir(self) -> list[Path]:
        """Remove what an interrupted archive or delete left in the archive
        folder: ``*.partial`` files, and files no ``LogsArchived`` event
        points at (the text is still in the database) or whose text a
        ``LogsDeleted`` event deleted. Returns the removed paths."""
        self._check_open()
        async with self._archive_lock:
            keep = {a.file for a in await self.log_archives() if a.deleted_seq is None}

            def clean() -> list[Path]:
                removed: list[Path] = []
                if not self.archive_dir.is_dir():
                    return removed
                for entry in self.archive_dir.iterdir():
                    if entry.is_file() and not entry.is_symlink() and entry.name not in keep:
                        if entry.name.endswith(arc.ARCHIVE_SUFFIX) or entry.name.endswith(".partial"):
                            entry.unlink()
                            arc.forget_reader(entry)
                            removed.append(entry)
                if removed:
                    arc.fsync_dir(self.archive_dir)
                return removed

            return await anyio.to_thread.run_sync(clean, limiter=self._archive_limiter)

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

    # -- subscriptions ----------------------------------------------------------

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
        while True:
            waiter = self._subs.register(after_seq, want_runs, want_types, limit)
            try:
                if waiter.closed:
                    raise StoreClosedError(f"{self.path}: the store is closed")
                found = None if waiter.reread else self._subs.recent(after_seq, want_runs, want_types, limit)
                if found is None:
                    found = await self._query_events(after_seq, limit, want_runs, want_types)
                if found:
                    return found
                if deadline is None:
                    await waiter.woken
                elif not waiter.woken.done():
                    loop = asyncio.get_running_loop()
                    timer = loop.call_at(deadline, waiter.wake)  # wakes with no result: timed out
                    try:
                        await waiter.woken
                    finally:
                        timer.cancel()
                if waiter.closed:
                    raise StoreClosedError(f"{self.path}: the store was closed while waiting")
                if waiter.result:
                    return waiter.result
                if not waiter.reread:  # timed out
                    return []
                # another process appended: loop to query the database
            finally:
                self._subs.unregister(waiter)

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
