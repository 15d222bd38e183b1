"""The shared core of the event store's roles: the connections, the
writer and the subscriptions of one open database (:class:`StoreCore`),
and the helpers the roles share. :class:`store.eventstore.EventStore`
composes the roles over one core (its ``open``)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import signal
import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Final

import aiosqlite
import anyio
import structlog

from store import archive as arc
from store.errors import StoreClosedError
from store.logblocks import LogBlock
from store.projections import validate_event
from store.schema import translate_error
from store.subscriptions import Subscriptions
from store.types import (
    LOG_LINES,
    Checkpoint,
    NewEvent,
    RecordedEvent,
)
from store.writer import PreparedEvent, Writer

__all__ = ["LogArchive", "LogReplay", "StoreCore", "log"]


def _unlink_durably(path: Path) -> None:
    path.unlink(missing_ok=True)
    arc.forget_reader(path)
    if path.parent.is_dir():
        arc.fsync_dir(path.parent)


log = structlog.get_logger("store")

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


class StoreCore:
    """What every role of the store works on: one open database's read
    connections (:meth:`_read`), its writer, subscriptions and archive
    folder. Made by :meth:`store.eventstore.EventStore.open`."""

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
