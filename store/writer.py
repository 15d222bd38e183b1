"""The one writer task: group commit of appends, and exclusive jobs (rebuild).

Every append is queued to a single task that owns the write connection.
The task takes the first queued append, keeps collecting for at most
``commit_window_s`` (or until the batch holds ``max_batch_rows`` events and
log lines), and writes the whole batch in one ``BEGIN IMMEDIATE``
transaction: check each append's expected version (a stale one fails alone
with :class:`ConcurrencyError`; the others go on), insert the events, fold
them into the projections, COMMIT. Only after COMMIT returned -- the batch is
durable under ``synchronous=FULL`` -- are the subscribers notified and the
appenders resumed. While one batch commits (fsync), the next one queues up,
so many concurrent appenders share few transactions.

Storage trouble (another process holding the write lock past the busy
timeout, a full disk, an I/O error) fails a batch with nothing written. An
append queued with ``wait_for_storage=True`` is then not failed: it is kept
at the head of the queue and retried with capped exponential back-off (with
jitter, as pyeventsourcing's ``retry`` does) until it is written or the store
closes; the daemon log gets one warning when writing stops, a reminder every
:data:`_REMIND_S` seconds, and one line when it resumes. The current trouble
is :attr:`Writer.problem` (what the daemon reports as its storage health).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import aiosqlite
import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from store.errors import (
    ConcurrencyError,
    StorageFullError,
    StoreClosedError,
    StoreError,
    StoreLockedError,
)
from store.logblocks import BlockResolver, LogBlock
from store.projections import Projector
from store.schema import translate_error, utc_now
from store.subscriptions import Subscriptions
from store.types import Checkpoint, RecordedEvent

__all__ = ["PreparedEvent", "StorageProblem", "Writer"]

log = structlog.get_logger("store.writer")

# The current version of each run of a JSON list, and (run NULL) the last seq: one round trip.
_STREAM_VERSIONS: Final = (
    "SELECT j.value, (SELECT MAX(version) FROM events WHERE run_id = j.value) FROM json_each(?) AS j"
    " UNION ALL SELECT NULL, COALESCE(MAX(seq), 0) FROM events"
)
_INSERT_EVENT: Final = "INSERT INTO events (seq, run_id, version, type, at, data) VALUES (?, ?, ?, ?, ?, ?)"
# A checkpoint only moves forward.
_UPSERT_CHECKPOINT: Final = (
    "INSERT INTO checkpoints (name, seq, updated_at) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET seq = MAX(seq, excluded.seq), updated_at = excluded.updated_at"
)

_SQLITE_IOERR: Final = 10  # https://sqlite.org/rescode.html#ioerr
#: Back-off between attempts of a batch that storage trouble failed, in
#: seconds: (first, cap) per kind. A lock already waited the busy timeout
#: inside SQLite, so its pause is short; a full disk is polled more slowly.
_BACKOFF_S: Final = {"locked": (0.05, 1.0), "disk full": (0.2, 2.0), "I/O error": (0.2, 2.0)}
#: While storage trouble lasts, the warning is repeated this often (seconds).
_REMIND_S: Final = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class StorageProblem:
    """Why the store cannot write right now.

    ``kind``: ``"locked"`` (another process holds the write lock),
    ``"disk full"`` or ``"I/O error"``; ``message``: the store error's text
    (names the file); ``since``: UTC time (RFC 3339) of the first failed
    attempt; ``waiting``: appends held for retry at the last attempt.
    """

    kind: str
    message: str
    since: str
    waiting: int

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "message", "since", "waiting"}``."""
        return dataclasses.asdict(self)


def _problem_kind(exc: sqlite3.Error, err: StoreError, path: Path) -> str | None:
    """The storage trouble ``exc`` is (retrying may succeed later), or None
    for an error that retrying cannot fix. An I/O error while the disk has
    no free block is a full disk (SQLite reports ENOSPC on the WAL index as
    SQLITE_IOERR_SHMSIZE, not SQLITE_FULL)."""
    if isinstance(err, StorageFullError):
        return "disk full"
    if isinstance(err, StoreLockedError):
        return "locked"
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_IOERR:
        try:
            st = os.statvfs(path.parent)
        except OSError:
            return "I/O error"
        return "disk full" if st.f_bavail == 0 else "I/O error"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedEvent:
    """An event ready to insert: its ``type``, its ``data`` as JSON text, and
    ``data`` decoded back from that text (what readers will see). A
    ``LogLines`` event carries its ``block`` instead: its data is made in
    the write transaction (:class:`store.logblocks.BlockResolver`)."""

    type: str
    data_json: str
    data: dict[str, Any]
    rows: int  # weight in the batch: 1 + its log lines
    block: LogBlock | None = None


@dataclasses.dataclass(eq=False, slots=True)
class _AppendJob:
    run_id: str
    expected_version: int | None  # None: at the stream's end, whatever its version (the stream must exist)
    events: Sequence[PreparedEvent]  # empty: a checkpoint-only job
    rows: int
    wait_for_storage: bool = False
    checkpoint: Checkpoint | None = None
    # Runs inside the transaction once the job's events are inserted and
    # projected (e.g. retention deleting the blocks its LogsArchived event
    # records as archived): it commits or rolls back with them.
    effect: Callable[[aiosqlite.Connection], Awaitable[None]] | None = None
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: list[RecordedEvent] | None = None
    error: BaseException | None = None
    # An all-or-nothing append to several streams (append_together): every
    # (run_id, expected_version, events), the first being the job's own.
    parts: Sequence[tuple[str, int | None, Sequence[PreparedEvent]]] | None = None


def _parts(job: _AppendJob) -> Sequence[tuple[str, int | None, Sequence[PreparedEvent]]]:
    return job.parts if job.parts is not None else ((job.run_id, job.expected_version, job.events),)


def _stale(expected: int | None, version: int) -> bool:
    return (expected is None and version == 0) or (expected is not None and expected != version)


@dataclasses.dataclass(eq=False, slots=True)
class _ExclusiveJob:
    fn: Callable[[aiosqlite.Connection], Awaitable[Any]]
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None


_Job = _AppendJob | _ExclusiveJob


class Writer:
    """Owns the write connection; run :meth:`run` as one task.

    ``transactions`` counts committed append batches; ``commit_times`` keeps
    ``(last_seq, time.monotonic_ns())`` of recent COMMITs (when each one
    returned) for benchmarks and diagnostics.
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        *,
        subscriptions: Subscriptions,
        commit_window_s: float,
        busy_timeout_s: float,
        max_batch_rows: int = 50_000,
    ) -> None:
        self._conn = conn
        self._path = path
        self._subs = subscriptions
        self._window = commit_window_s
        self._busy_timeout_s = busy_timeout_s
        self._max_rows = max_batch_rows
        self._projector = Projector()
        send, receive = anyio.create_memory_object_stream[_Job](max_buffer_size=float("inf"))
        self._send: MemoryObjectSendStream[_Job] = send
        self._receive: MemoryObjectReceiveStream[_Job] = receive
        self._failure: BaseException | None = None
        # Appends that storage trouble failed and that wait for storage:
        # the head of the next batch, after a back-off.
        self._retry: list[_AppendJob] = []
        self._attempts = 0  # failed attempts in a row
        self._closing = anyio.Event()
        self._last_warning = 0.0
        #: The current storage trouble, None while writes succeed.
        self.problem: StorageProblem | None = None
        #: Storage troubles so far (each counted when it starts), and the
        #: last one that ended with ``resumed_at`` (UTC, RFC 3339).
        self.incidents = 0
        self.last_incident: dict[str, Any] | None = None
        self.transactions = 0
        self.commit_times: collections.deque[tuple[int, int]] = collections.deque(maxlen=10_000)

    # -- the caller side ------------------------------------------------

    def _enqueue(self, job: _Job) -> None:
        if self._failure is not None:
            raise StoreClosedError(f"{self._path}: the store's writer failed: {self._failure}") from self._failure
        try:
            self._send.send_nowait(job)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise StoreClosedError(f"{self._path}: the store is closed") from None

    async def append(
        self,
        run_id: str,
        expected_version: int | None,
        events: Sequence[PreparedEvent],
        checkpoint: Checkpoint | None = None,
        *,
        wait_for_storage: bool = False,
        effect: Callable[[aiosqlite.Connection], Awaitable[None]] | None = None,
    ) -> list[RecordedEvent]:
        """Queue one append and wait until its batch committed (or failed).
        ``checkpoint`` moves (forward only) in the same transaction, only if
        the append is accepted; with no ``events`` only the checkpoint moves.
        ``effect(conn)`` runs in the same transaction after the events are
        inserted and projected, only if the append is accepted (an error it
        raises fails the whole batch).

        With ``wait_for_storage``, a lock held by another process, a full
        disk or an I/O error does not fail the append: it is retried with
        back-off until written (it fails only with :class:`StoreClosedError`
        once the store closes, or with a non-storage error). Without it, such
        trouble raises StoreLockedError / StorageFullError / StoreError.
        Cancelling the caller does not withdraw a queued append: it may
        still be recorded.
        """
        job = _AppendJob(
            run_id, expected_version, events, max(1, sum(e.rows for e in events)), wait_for_storage, checkpoint, effect
        )
        self._enqueue(job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    async def append_many(
        self, appends: Sequence[tuple[str, int | None, Sequence[PreparedEvent], Checkpoint | None]]
    ) -> list[list[RecordedEvent] | StoreError]:
        """Queue several appends ``(run_id, expected_version, events,
        checkpoint)`` together, in order (nothing else is queued between
        them), and wait until each one's batch committed or failed: per
        append its recorded events or its StoreError (each fails on its own,
        as with :meth:`append`). Raises StoreClosedError when nothing can be
        queued. Cancelling the caller does not withdraw the queued appends."""
        jobs = [
            _AppendJob(run_id, version, events, max(1, sum(e.rows for e in events)), False, checkpoint)
            for run_id, version, events, checkpoint in appends
        ]
        for job in jobs:  # no await in between: they stay together in the queue, and if the
            self._enqueue(job)  # first one could be queued (the store is open) so can the others
        out: list[list[RecordedEvent] | StoreError] = []
        for job in jobs:
            if not job.done.is_set():  # (a set anyio Event still passes through the event loop)
                await job.done.wait()
            if job.error is not None:
                if not isinstance(job.error, StoreError):
                    raise job.error
                out.append(job.error)
            else:
                assert job.result is not None
                out.append(job.result)
        return out

    async def append_together(
        self, appends: Sequence[tuple[str, int | None, Sequence[PreparedEvent]]]
    ) -> list[list[RecordedEvent]]:
        """Append to several streams ``(run_id, expected_version, events)``
        (each run at most once, each with events) all or nothing: in one
        transaction, in this order, with consecutive seqs. Returns each
        append's recorded events. Raises ConcurrencyError (any stale
        version: nothing written) or a store error as :meth:`append`."""
        if not appends:
            return []
        first = appends[0]
        job = _AppendJob(
            first[0],
            first[1],
            first[2],
            max(1, sum(e.rows for _, _, events in appends for e in events)),
            parts=list(appends),
        )
        self._enqueue(job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        out: dict[str, list[RecordedEvent]] = {run_id: [] for run_id, _, _ in appends}
        for event in job.result:
            out[event.run_id].append(event)
        return [out[run_id] for run_id, _, _ in appends]

    async def exclusive(self, fn: Callable[[aiosqlite.Connection], Awaitable[Any]]) -> Any:
        """Run ``fn(conn)`` on the write connection between batches, alone."""
        job = _ExclusiveJob(fn)
        self._enqueue(job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def close(self) -> None:
        """Stop accepting jobs; :meth:`run` returns once the queue is drained
        (appends waiting for storage get one more attempt, then fail)."""
        self._closing.set()
        self._send.close()

    # -- the task ---------------------------------------------------------

    async def run(self) -> None:
        """The writer task body: returns after :meth:`close` once every queued
        job is done. If it fails, every queued job fails with
        :class:`StoreClosedError` and so do later ones."""
        try:
            async with self._receive:
                while True:
                    if self._retry:
                        first, self._retry = self._retry, []
                    else:
                        try:
                            job = await self._receive.receive()
                        except anyio.EndOfStream:
                            return
                        if isinstance(job, _ExclusiveJob):
                            await self._run_exclusive(job)
                            continue
                        first = [job]
                    batch, held = await self._collect(first)
                    with anyio.CancelScope(shield=True):  # a batch is all or nothing
                        await self._commit(batch)
                    if held is not None:
                        await self._run_exclusive(held)
                    if self._retry:
                        await self._back_off()
        except BaseException as exc:
            self._failure = exc
            self._send.close()
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                log.warning("store.writer_cancelled", path=str(self._path), hint="close the store before its loop ends")
            else:
                log.error("store.writer_failed", path=str(self._path), error=repr(exc))
            left: list[_Job] = list(self._retry)
            self._retry = []
            while True:
                try:
                    left.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
            for job in left:
                job.error = StoreClosedError(f"{self._path}: the store's writer failed: {exc!r}")
                job.done.set()
            raise

    async def _back_off(self) -> None:
        """Pause before the next attempt of the appends held for retry:
        capped exponential back-off with +-10% jitter; cut short when the
        store closes."""
        kind = self.problem.kind if self.problem is not None else "I/O error"
        first, cap = _BACKOFF_S.get(kind, (0.2, 2.0))
        delay = min(cap, first * 2 ** min(self._attempts - 1, 16)) * (1 + 0.2 * (random.random() - 0.5))  # noqa: S311 - jitter, not a secret
        with anyio.move_on_after(delay):
            await self._closing.wait()

    def _storage_failed(self, kind: str, err: StoreError, batch: list[_AppendJob]) -> None:
        """Storage trouble failed ``batch``: hold its appends that wait for
        storage for the next attempt (unless the store is closing), fail the
        others with ``err``, and warn (at the first failure, then every
        :data:`_REMIND_S` seconds)."""
        self._attempts += 1
        for job in batch:
            if job.error is not None:  # e.g. a stale expected_version: failed alone
                continue
            job.result = None
            if job.wait_for_storage and not self._closing.is_set():
                self._retry.append(job)
            else:
                job.error = err
        now = time.monotonic()
        first = self.problem is None or self.problem.kind != kind
        since = utc_now() if first or self.problem is None else self.problem.since
        if first:
            self.incidents += 1
        self.problem = StorageProblem(kind, str(err), since, len(self._retry))
        if first or now - self._last_warning >= _REMIND_S:
            self._last_warning = now
            log.warning(
                "store.write_blocked",
                path=str(self._path),
                problem=kind,
                since=since,
                error=str(err),
                waiting_appends=len(self._retry),
                failed_appends=sum(1 for j in batch if j.error is err),
                hint="appends that wait for storage are retried with back-off until written",
            )

    def _storage_ok(self) -> None:
        """A batch committed: storage trouble, if any, is over."""
        if self.problem is not None:
            log.warning(
                "store.write_resumed",
                path=str(self._path),
                problem=self.problem.kind,
                since=self.problem.since,
                attempts=self._attempts,
            )
            self.last_incident = {**self.problem.to_json(), "resumed_at": utc_now(), "attempts": self._attempts}
            self.last_incident.pop("waiting", None)
        self.problem = None
        self._attempts = 0

    async def _collect(self, first: list[_AppendJob]) -> tuple[list[_AppendJob], _ExclusiveJob | None]:
        """The batch starting with ``first``: whatever else is queued or
        arrives within the commit window, up to ``max_batch_rows``. An
        exclusive job ends the batch and is returned to run after it."""
        batch, rows = list(first), sum(j.rows for j in first)
        deadline = time.monotonic() + self._window
        while rows < self._max_rows:
            job: _Job | None = None
            try:
                job = self._receive.receive_nowait()
            except anyio.WouldBlock:
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    with anyio.move_on_after(remaining):
                        with contextlib.suppress(anyio.EndOfStream):
                            job = await self._receive.receive()
            except anyio.EndOfStream:
                pass
            if job is None:  # the window elapsed, or the store is closing
                break
            if isinstance(job, _ExclusiveJob):
                return batch, job
            batch.append(job)
            rows += job.rows
        return batch, None

    async def _run_exclusive(self, job: _ExclusiveJob) -> None:
        try:
            job.result = await job.fn(self._conn)
        except sqlite3.Error as exc:
            job.error = translate_error(exc, self._path, self._busy_timeout_s)
            job.error.__cause__ = exc
        except Exception as exc:  # noqa: BLE001 - handed to the job's caller, which re-raises it
            job.error = exc
        finally:
            job.done.set()

    async def _commit(self, batch: list[_AppendJob]) -> None:
        """Write ``batch`` in one transaction; resolve every job in it."""
        conn = self._conn
        recorded: list[RecordedEvent] = []
        accepted: list[_AppendJob] = []
        committed = False
        interrupted: BaseException | None = None
        try:
            if conn.in_transaction:  # a ROLLBACK that failed in the last attempt (full disk)
                await conn.execute("ROLLBACK")
            await conn.execute("BEGIN IMMEDIATE")
            try:
                versions, seq = await self._stream_versions(
                    {run_id for job in batch if job.events for run_id, _, _ in _parts(job)}
                )
                at = utc_now()
                inserts: list[tuple[int, str, int, str, str, str]] = []
                resolver = BlockResolver(conn)
                await resolver.prefetch(
                    {
                        (run_id, event.block.source)
                        for job in batch
                        for run_id, _, events in _parts(job)
                        for event in events
                        if event.block is not None
                    }
                )
                checkpoints: list[tuple[str, int, str]] = []
                for job in batch:
                    if job.checkpoint is not None:
                        checkpoints.append((job.checkpoint.name, job.checkpoint.seq, at))
                    if not job.events:  # checkpoint only
                        job.result = []
                        accepted.append(job)
                        continue
                    stale = next(
                        (p for p in _parts(job) if _stale(p[1], versions.get(p[0], 0))), None
                    )  # a part of an all-or-nothing job fails them all
                    if stale is not None:
                        job.error = ConcurrencyError(stale[0], stale[1], versions.get(stale[0], 0))
                        if job.checkpoint is not None:
                            checkpoints.pop()
                        continue
                    result = []
                    for run_id, _, events in _parts(job):
                        version = versions.get(run_id, 0)
                        for event in events:
                            seq += 1
                            version += 1
                            data, data_json = event.data, event.data_json
                            if event.block is not None:
                                data = await resolver.resolve(run_id, seq, event.block)
                                data_json = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
                            inserts.append((seq, run_id, version, event.type, at, data_json))
                            result.append(RecordedEvent(seq, run_id, version, event.type, at, data))
                        versions[run_id] = version
                    job.result = result
                    accepted.append(job)
                    recorded.extend(result)
                if inserts:
                    await conn.executemany(_INSERT_EVENT, inserts)
                    await resolver.flush()
                    await self._projector.apply(conn, recorded, [row[5] for row in inserts])
                for job in accepted:
                    if job.effect is not None:
                        await job.effect(conn)
                if checkpoints:
                    await conn.executemany(_UPSERT_CHECKPOINT, checkpoints)
                await conn.execute("COMMIT")
                committed = True
            except BaseException:
                if conn.in_transaction:
                    await conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            err = translate_error(exc, self._path, self._busy_timeout_s)
            err.__cause__ = exc
            kind = _problem_kind(exc, err, self._path)
            if kind is not None:
                self._storage_failed(kind, err, batch)
            else:
                log.warning("store.append_failed", path=str(self._path), error=str(exc), appends=len(batch))
                for job in batch:
                    if job.error is None:
                        job.error = err
        except BaseException as exc:  # a bug or a cancellation: the writer stops (see run)
            interrupted = exc
            raise
        finally:
            try:
                if committed:
                    self._storage_ok()
                if committed and recorded:
                    self.transactions += 1
                    self.commit_times.append((recorded[-1].seq, time.monotonic_ns()))
                    self._subs.publish(recorded)
            finally:
                held = {id(j) for j in self._retry}
                for job in batch:
                    if id(job) in held:
                        continue  # held for the next attempt
                    if not committed and job in accepted:
                        job.result = None
                    if job.result is None and job.error is None:  # never leave one hanging
                        job.error = StoreClosedError(f"{self._path}: the append was interrupted: {interrupted!r}")
                        job.error.__cause__ = interrupted
                    job.done.set()

    async def _stream_versions(self, run_ids: set[str]) -> tuple[dict[str, int], int]:
        """The current version of each of ``run_ids`` that has events (one
        index seek per run: a bare ``MAX`` subquery; ``MAX ... GROUP BY``
        would read every event of the run's stream), and the last seq of
        the log (0 when empty), in one query."""
        rows = await self._conn.execute_fetchall(_STREAM_VERSIONS, (json.dumps(sorted(run_ids)),))
        versions, last_seq = {}, 0
        for run_id, value in rows:
            if run_id is None:
                last_seq = int(value)
            elif value is not None:
                versions[str(run_id)] = int(value)
        return versions, last_seq
