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
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import aiosqlite
import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from store.errors import ConcurrencyError, StoreClosedError
from store.logblocks import BlockResolver, LogBlock
from store.projections import Projector
from store.schema import translate_error, utc_now
from store.subscriptions import Subscriptions
from store.types import RecordedEvent

__all__ = ["Writer", "PreparedEvent"]

log = structlog.get_logger("store.writer")

_STREAM_VERSIONS: Final = (
    "SELECT j.value, (SELECT MAX(version) FROM events WHERE run_id = j.value) FROM json_each(?) AS j"
)
_INSERT_EVENT: Final = "INSERT INTO events (seq, run_id, version, type, at, data) VALUES (?, ?, ?, ?, ?, ?)"


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
    expected_version: int
    events: Sequence[PreparedEvent]
    rows: int
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    result: list[RecordedEvent] | None = None
    error: BaseException | None = None


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

    async def append(self, run_id: str, expected_version: int, events: Sequence[PreparedEvent]) -> list[RecordedEvent]:
        """Queue one append and wait until its batch committed (or failed).

        Cancelling the caller does not withdraw a queued append: it may
        still be recorded.
        """
        job = _AppendJob(run_id, expected_version, events, sum(e.rows for e in events))
        self._enqueue(job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    async def exclusive(self, fn: Callable[[aiosqlite.Connection], Awaitable[Any]]) -> Any:
        """Run ``fn(conn)`` on the write connection between batches, alone."""
        job = _ExclusiveJob(fn)
        self._enqueue(job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def close(self) -> None:
        """Stop accepting jobs; :meth:`run` returns once the queue is drained."""
        self._send.close()

    # -- the task ---------------------------------------------------------

    async def run(self) -> None:
        """The writer task body: returns after :meth:`close` once every queued
        job is done. If it fails, every queued job fails with
        :class:`StoreClosedError` and so do later ones."""
        try:
            async with self._receive:
                while True:
                    try:
                        job = await self._receive.receive()
                    except anyio.EndOfStream:
                        return
                    if isinstance(job, _ExclusiveJob):
                        await self._run_exclusive(job)
                        continue
                    batch, held = await self._collect(job)
                    with anyio.CancelScope(shield=True):  # a batch is all or nothing
                        await self._commit(batch)
                    if held is not None:
                        await self._run_exclusive(held)
        except BaseException as exc:
            self._failure = exc
            self._send.close()
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                log.warning("store.writer_cancelled", path=str(self._path), hint="close the store before its loop ends")
            else:
                log.error("store.writer_failed", path=str(self._path), error=repr(exc))
            while True:
                try:
                    job = self._receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                job.error = StoreClosedError(f"{self._path}: the store's writer failed: {exc!r}")
                job.done.set()
            raise

    async def _collect(self, first: _AppendJob) -> tuple[list[_AppendJob], _ExclusiveJob | None]:
        """The batch starting with ``first``: whatever else is queued or
        arrives within the commit window, up to ``max_batch_rows``. An
        exclusive job ends the batch and is returned to run after it."""
        batch, rows = [first], first.rows
        deadline = time.monotonic() + self._window
        while rows < self._max_rows:
            job: _Job | None = None
            try:
                job = self._receive.receive_nowait()
            except anyio.WouldBlock:
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    with anyio.move_on_after(remaining):
                        try:
                            job = await self._receive.receive()
                        except anyio.EndOfStream:
                            pass
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
        except Exception as exc:
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
            await conn.execute("BEGIN IMMEDIATE")
            try:
                versions = await self._stream_versions({job.run_id for job in batch})
                rows = list(await conn.execute_fetchall("SELECT COALESCE(MAX(seq), 0) FROM events"))
                seq = int(rows[0][0])
                at = utc_now()
                inserts: list[tuple[int, str, int, str, str, str]] = []
                resolver = BlockResolver(conn)
                for job in batch:
                    version = versions.get(job.run_id, 0)
                    if job.expected_version != version:
                        job.error = ConcurrencyError(job.run_id, job.expected_version, version)
                        continue
                    result = []
                    for event in job.events:
                        seq += 1
                        version += 1
                        data, data_json = event.data, event.data_json
                        if event.block is not None:
                            data = await resolver.resolve(job.run_id, seq, event.block)
                            data_json = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
                        inserts.append((seq, job.run_id, version, event.type, at, data_json))
                        result.append(RecordedEvent(seq, job.run_id, version, event.type, at, data))
                    versions[job.run_id] = version
                    job.result = result
                    accepted.append(job)
                    recorded.extend(result)
                if inserts:
                    await conn.executemany(_INSERT_EVENT, inserts)
                    await resolver.flush()
                    await self._projector.apply(conn, recorded, [row[5] for row in inserts])
                await conn.execute("COMMIT")
                committed = True
            except BaseException:
                if conn.in_transaction:
                    await conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            log.warning("store.append_failed", path=str(self._path), error=str(exc), appends=len(batch))
            for job in batch:
                if job.error is None:
                    job.error = translate_error(exc, self._path, self._busy_timeout_s)
                    job.error.__cause__ = exc
        except BaseException as exc:  # a bug or a cancellation: the writer stops (see run)
            interrupted = exc
            raise
        finally:
            try:
                if committed and recorded:
                    self.transactions += 1
                    self.commit_times.append((recorded[-1].seq, time.monotonic_ns()))
                    self._subs.publish(recorded)
            finally:
                for job in batch:
                    if not committed and job in accepted:
                        job.result = None
                    if job.result is None and job.error is None:  # never leave one hanging
                        job.error = StoreClosedError(f"{self._path}: the append was interrupted: {interrupted!r}")
                        job.error.__cause__ = interrupted
                    job.done.set()

    async def _stream_versions(self, run_ids: set[str]) -> dict[str, int]:
        """The current version of each of ``run_ids`` that has events: one
        index seek per run (a bare ``MAX`` subquery; ``MAX ... GROUP BY``
        would read every event of the run's stream)."""
        rows = await self._conn.execute_fetchall(_STREAM_VERSIONS, (json.dumps(sorted(run_ids)),))
        return {str(r[0]): int(r[1]) for r in rows if r[1] is not None}
