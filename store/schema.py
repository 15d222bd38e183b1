"""The SQLite schema: DDL, append-only triggers, forward migrations, opening.

One database file holds the event log (``events``), the projections derived
from it (:data:`PROJECTION_TABLES`) and ``schema_migrations``, one row per
applied migration (the schema version is its highest ``version``).

Opening (:func:`open_connection`) never writes to a file it has not first
recognised: SQLite reads the schema (refusing a non-database file), then the
schema version is read; only a jobsup database of this or an older version
is switched to WAL and migrated. A non-SQLite or corrupt file raises :class:`NotADatabaseError`, a
database from a newer jobsup raises :class:`SchemaTooNewError`, and in both
cases the file is left byte-for-byte untouched.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, Literal

import aiosqlite
import structlog

from store.errors import (
    NotADatabaseError,
    SchemaTooNewError,
    StorageFullError,
    StoreError,
    StoreLockedError,
    StoreOpenError,
)
from store.logblocks import migrate_v3
from store.outputindex import OUTPUT_FILES_DDL, OUTPUT_FILES_FILL
from store.runmeta import RUN_META_DDL

__all__ = [
    "CHECKPOINTS_DDL",
    "MIGRATIONS",
    "MIGRATION_CHECKPOINTS",
    "PAGE_SIZE",
    "PROJECTION_DDL",
    "PROJECTION_TABLES",
    "SCHEMA_VERSION",
    "Migration",
    "RebuildProjections",
    "Synchronous",
    "open_connection",
    "translate_error",
    "utc_now",
]

log = structlog.get_logger("store.schema")

Synchronous = Literal["FULL", "NORMAL", "OFF"]


# Primary result codes (https://sqlite.org/rescode.html).
_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_CORRUPT: Final = 11
_SQLITE_FULL: Final = 13
_SQLITE_NOTADB: Final = 26

#: The page size of a new database, in bytes (see :func:`open_connection`).
PAGE_SIZE: Final = 65536
#: The WAL is checkpointed into the database about every this many bytes.
_CHECKPOINT_BYTES: Final = 32 << 20
#: After a checkpoint the WAL file is cut back to this many bytes when
#: SQLite starts it over (``PRAGMA journal_size_limit``): without it the
#: file keeps its largest size for good (33 MB on a disk that had filled up).
WAL_SIZE_LIMIT_BYTES: Final = 4 << 20
#: The writer connection's page cache (``PRAGMA cache_size``), in KiB: 256
#: pages of 64 KiB, two log blocks of the largest size the local tailer
#: reads (8 MiB).
WRITER_CACHE_KIB: Final = 16384

_EVENTS_DDL: Final[tuple[str, ...]] = (
    """CREATE TABLE events (
        seq     INTEGER PRIMARY KEY,
        run_id  TEXT    NOT NULL,
        version INTEGER NOT NULL CHECK (version >= 1),
        type    TEXT    NOT NULL,
        at      TEXT    NOT NULL,
        data    TEXT    NOT NULL,
        UNIQUE (run_id, version)
    )""",
    # The log is append-only: the schema itself refuses UPDATE and DELETE
    # (README, "Events"), and every INSERT must extend both
    # the global order and its run's stream by exactly one.
    """CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: UPDATE is refused'); END""",
    """CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE is refused'); END""",
    """CREATE TRIGGER events_in_order BEFORE INSERT ON events
    WHEN NEW.seq <= (SELECT COALESCE(MAX(seq), 0) FROM events)
      OR NEW.version <> (SELECT COALESCE(MAX(version), 0) FROM events WHERE run_id = NEW.run_id) + 1
    BEGIN SELECT RAISE(ABORT, 'events: seq must increase and version must follow its run''s last'); END""",
)

_RUNS_DDL: Final[tuple[str, ...]] = (
    """CREATE TABLE runs (
        id          TEXT    PRIMARY KEY,
        project     TEXT    NOT NULL,
        name        TEXT    NOT NULL,
        backend     TEXT    NOT NULL,
        phase       TEXT    NOT NULL,
        reason      TEXT,
        message     TEXT,
        exit_code   INTEGER,
        created_at  TEXT    NOT NULL,
        created_seq INTEGER NOT NULL,
        updated_at  TEXT    NOT NULL,
        last_seq    INTEGER NOT NULL,
        version     INTEGER NOT NULL,
        handle      TEXT    NOT NULL,
        log_lines   INTEGER NOT NULL
    )""",
    "CREATE INDEX runs_by_created ON runs (created_seq)",
    "CREATE INDEX runs_by_project ON runs (project, created_seq)",
)

# The newest recorded line of each (run, source): where a tailer resumes.
_LOG_SOURCES_DDL: Final = """CREATE TABLE log_sources (
        run_id  TEXT    NOT NULL,
        source  TEXT    NOT NULL,
        pos     TEXT    NOT NULL,
        line_no INTEGER NOT NULL,
        PRIMARY KEY (run_id, source)
    ) WITHOUT ROWID"""

# Where each run's archived log text is (retention): from LogsArchived and
# LogsDeleted events. Lines 1..lines are in the file while deleted_seq is NULL.
_LOG_ARCHIVES_DDL: Final = """CREATE TABLE log_archives (
        run_id       TEXT    PRIMARY KEY,
        file         TEXT    NOT NULL,
        sha256       TEXT    NOT NULL,
        lines        INTEGER NOT NULL,
        bytes        INTEGER NOT NULL,
        archived_seq INTEGER NOT NULL,
        archived_at  TEXT    NOT NULL,
        deleted_seq  INTEGER,
        deleted_at   TEXT
    ) WITHOUT ROWID"""

# What a run used and where (times, queue, GPUs, usage): one JSON object per
# run, folded from Submitted, PhaseChanged, Admitted and ResourceUsage
# (store.projections._fold_facts). A table of its own, so the runs table and
# its queries stay as they are (RUN_COLUMNS reads it with a subquery).
_RUN_FACTS_DDL: Final = """CREATE TABLE run_facts (
        run_id TEXT PRIMARY KEY,
        facts  TEXT NOT NULL
    ) WITHOUT ROWID"""

#: The projection tables at :data:`SCHEMA_VERSION`, dropped and recreated by
#: ``rebuild()``. (``log_blocks``, the log text, is data beside the events,
#: not a projection: see :mod:`store.logblocks`.)
PROJECTION_TABLES: Final[tuple[str, ...]] = (
    "runs",
    "log_sources",
    "log_archives",
    "run_facts",
    "run_meta",
    "output_files",
)

#: DDL of the projection tables at :data:`SCHEMA_VERSION`. A migration that
#: changes a projection table changes this and sets ``rebuild_projections``.
PROJECTION_DDL: Final[tuple[str, ...]] = (
    # Schema 3 adds log_ingest: "pending" while a terminal run's output
    # backlog is still being recorded, "done" once it is, NULL before either.
    _RUNS_DDL[0].replace("log_lines   INTEGER NOT NULL", "log_lines   INTEGER NOT NULL,\n        log_ingest  TEXT"),
    *_RUNS_DDL[1:],
    _LOG_SOURCES_DDL,
    _LOG_ARCHIVES_DDL,
    _RUN_FACTS_DDL,
    *RUN_META_DDL,
    *OUTPUT_FILES_DDL,
)


@dataclasses.dataclass(frozen=True)
class Migration:
    """One forward step of the schema: ``statements`` run, then ``run``
    (if any: a function of the connection, for steps SQL alone cannot
    express); with ``rebuild_projections`` the projection tables are
    dropped, recreated from :data:`PROJECTION_DDL` and replayed from the
    event log once every pending step is applied. All pending steps and
    the rebuild share one transaction."""

    title: str
    statements: tuple[str, ...]
    rebuild_projections: bool = False
    run: Callable[[aiosqlite.Connection], Awaitable[None]] | None = None


#: Where each named subscriber of the log (a hook) has got to: ``seq`` is the
#: last event it has finished with. Not a projection (nothing derives it from
#: events, and ``rebuild()`` leaves it alone): a tracking table in the sense
#: of pyeventsourcing's ``ProcessRecorder`` (its ``tracking`` table), one row
#: per subscriber holding its highest position rather than one row per
#: processed event. It moves forward only, in the same transaction as the
#: subscriber's outcome events (see ``EventStore.append(checkpoint=...)``).
CHECKPOINTS_DDL: Final = """CREATE TABLE IF NOT EXISTS checkpoints (
        name       TEXT    PRIMARY KEY,
        seq        INTEGER NOT NULL CHECK (seq >= 0),
        updated_at TEXT    NOT NULL
    ) WITHOUT ROWID"""

#: The migration that adds :data:`CHECKPOINTS_DDL`. Self-contained and
#: idempotent (``IF NOT EXISTS``), so its place in :data:`MIGRATIONS` can
#: change when branches adding other steps are merged.
MIGRATION_CHECKPOINTS: Final = Migration("subscription checkpoints (hooks)", (CHECKPOINTS_DDL,))

#: ``MIGRATIONS[i]`` takes a database from schema version ``i`` to ``i + 1``.
#: Append only; never edit a released migration.
MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        "the event log; run status and log line projections",
        _EVENTS_DDL
        + _RUNS_DDL
        + (
            """CREATE TABLE log_lines (
                run_id  TEXT    NOT NULL,
                line_no INTEGER NOT NULL,
                stream  TEXT    NOT NULL,
                source  TEXT    NOT NULL,
                pos     TEXT    NOT NULL,
                text    TEXT    NOT NULL,
                seq     INTEGER NOT NULL,
                PRIMARY KEY (run_id, line_no),
                UNIQUE (run_id, source, pos)
            ) WITHOUT ROWID""",
            _LOG_SOURCES_DDL,
        ),
    ),
    Migration(
        "log lines as blocks of their LogLines events: the text is stored once",
        ("DROP TABLE log_lines",),
        rebuild_projections=True,
    ),
    MIGRATION_CHECKPOINTS,
    Migration(
        "log text in blocks beside the events (log_blocks); LogLines events record ranges and digests",
        (),
        rebuild_projections=True,
        run=migrate_v3,
    ),
    # No LogsArchived event exists before this step: the table starts empty.
    # Self-contained and idempotent, so its place can change when branches
    # adding other steps are merged.
    Migration(
        "archived log text (retention): log_archives",
        (_LOG_ARCHIVES_DDL.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1),),
    ),
    # Self-contained and idempotent; the rebuild folds the facts of every
    # run already recorded.
    Migration(
        "what a run used and where: run_facts (times, queue, GPUs, usage)",
        (_RUN_FACTS_DDL.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1),),
        rebuild_projections=True,
    ),
    # Labels, sweeps, params and progress (store.runmeta): from the Submitted
    # and Progress events. Self-contained and idempotent (IF NOT EXISTS), so
    # its place can change when branches adding other steps are merged. No
    # run recorded before has labels, a sweep or progress: it starts empty.
    Migration("run labels, sweeps, params and progress: run_meta", RUN_META_DDL),
    # Output files by sha256 (store.outputindex), filled from the
    # OutputsRecorded events already recorded. Self-contained and
    # idempotent (IF NOT EXISTS, INSERT OR IGNORE): its place can change
    # when branches adding other steps are merged.
    Migration("output files by sha256 (jobsup which): output_files", (*OUTPUT_FILES_DDL, OUTPUT_FILES_FILL)),
)

#: The schema version this jobsup writes.
SCHEMA_VERSION: Final = len(MIGRATIONS)

#: Replays the event log into freshly created projection tables, inside the
#: caller's transaction (``Projector.rebuild``; passed in to keep this module
#: free of the projection code).
RebuildProjections = Callable[[aiosqlite.Connection], Awaitable[object]]


def utc_now() -> str:
    """The current UTC time in RFC 3339 with microseconds and ``Z``,
    e.g. ``2026-11-29T15:27:52.123456Z``."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def translate_error(exc: sqlite3.Error, path: Path, busy_timeout_s: float) -> StoreError:
    """A store error for an SQLite error raised while using ``path``.

    Disk full (SQLITE_FULL) -> :class:`StorageFullError`; locked past the
    busy timeout (SQLITE_BUSY/LOCKED) -> :class:`StoreLockedError`; not a
    database or corrupt (SQLITE_NOTADB/CORRUPT) -> :class:`NotADatabaseError`;
    anything else -> :class:`StoreError`. The message names the file.
    Result codes: https://sqlite.org/rescode.html.
    """
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code == _SQLITE_FULL:
        return StorageFullError(
            f"{path}: the database cannot grow (disk or size limit full: {exc}); nothing was written"
        )
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreLockedError(
            f"{path}: another process held the database lock for more than"
            f" {busy_timeout_s:g}s ({exc}); nothing was written"
        )
    if code in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
        return NotADatabaseError(f"{path}: not a usable SQLite database ({exc}); the file was left untouched")
    return StoreError(f"{path}: SQLite error: {exc}")


async def _schema_version(conn: aiosqlite.Connection, path: Path) -> int:
    """The schema version of an open database: 0 for an empty one.

    Raises StoreOpenError for an SQLite database that is not jobsup's.
    """
    rows = await conn.execute_fetchall(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    )
    tables = {str(r[0]) for r in rows}
    if not tables:
        return 0
    if "schema_migrations" not in tables:
        raise StoreOpenError(
            f"{path}: an SQLite database but not a jobsup one (tables: {', '.join(sorted(tables))});"
            " the file was left untouched"
        )
    rows = await conn.execute_fetchall("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
    return int(next(iter(rows))[0])


async def _migrate(conn: aiosqlite.Connection, path: Path, rebuild: RebuildProjections) -> None:
    """Apply the missing migrations, all in one IMMEDIATE transaction (so
    two processes opening a fresh file at once migrate it once, and a crash
    leaves the old version whole), then rebuild the projections once if
    any of them asks for it."""
    await conn.execute("BEGIN IMMEDIATE")
    try:
        version = await _schema_version(conn, path)
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{path}: written by a newer jobsup (schema version {version}, this jobsup"
                f" knows up to {SCHEMA_VERSION}); the file was left untouched"
            )
        if version == 0:
            await conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        applied = []
        for step in range(version, SCHEMA_VERSION):
            migration = MIGRATIONS[step]
            for statement in migration.statements:
                await conn.execute(statement)
            if migration.run is not None:
                await migration.run(conn)
            await conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (step + 1, utc_now())
            )
            applied.append(migration)
        if any(m.rebuild_projections for m in applied):
            await rebuild(conn)
        await conn.execute("COMMIT")
        for step, migration in enumerate(applied, version + 1):
            log.info("store.migrated", path=str(path), schema_version=step, migration=migration.title)
    except BaseException:
        if conn.in_transaction:
            await conn.execute("ROLLBACK")
        raise


async def _ensure_incremental_vacuum(conn: aiosqlite.Connection, path: Path) -> None:
    """Switch a database made before schema 5 to ``auto_vacuum =
    INCREMENTAL``, once: SQLite applies the change only by rewriting the
    file (``VACUUM``: about as long as copying it, and it needs that much
    free space). If that fails (no space, another process reading), the
    database works as before -- freed pages are reused but the file does
    not shrink -- and the next start tries again."""
    rows = list(await conn.execute_fetchall("PRAGMA auto_vacuum"))
    if int(rows[0][0]) == 2:
        return
    started = dt.datetime.now(dt.UTC)
    size = path.stat().st_size if path.exists() else 0  # noqa: ASYNC240 - once at open, before the store serves anyone
    try:
        await conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        await conn.execute("VACUUM")
    except sqlite3.Error as exc:
        log.warning("store.vacuum_skipped", path=str(path), error=str(exc),
                    hint="the database works; it shrinks after retention only once this VACUUM succeeds")  # fmt: skip
        return
    log.info(
        "store.auto_vacuum_enabled",
        path=str(path),
        bytes_before=size,
        bytes_after=path.stat().st_size,  # noqa: ASYNC240 - once at open
        seconds=(dt.datetime.now(dt.UTC) - started).total_seconds(),
    )


async def open_connection(
    path: Path,
    *,
    synchronous: Synchronous,
    busy_timeout_s: float,
    writer: bool,
    rebuild: RebuildProjections | None = None,
) -> aiosqlite.Connection:
    """Open ``path`` (creating it if missing) as a jobsup database.

    The writer connection (``writer=True``) also switches the file to WAL and
    runs the forward migrations (``rebuild`` replays the projections for
    those that need it); reader connections are ``query_only``.
    Connections are in autocommit mode: callers issue BEGIN/COMMIT.

    Raises NotADatabaseError, SchemaTooNewError, StoreOpenError (not jobsup's,
    unreadable) and StoreLockedError; the file is untouched in every case
    but the last.
    """
    # No pre-check of the file header with open()/close() here: closing any
    # descriptor of the database file drops every POSIX lock this process
    # holds on it (fcntl(2)), including those of SQLite connections already
    # open, and another process could then delete our live WAL. SQLite itself
    # refuses a non-database file (SQLITE_NOTADB) without writing to it.
    if path.is_dir():  # noqa: ASYNC240 - once at open, before the store serves anyone
        raise NotADatabaseError(f"{path}: is a directory, not an SQLite database file")
    try:
        conn = await aiosqlite.connect(os.fspath(path), isolation_level=None, timeout=busy_timeout_s)
    except sqlite3.Error as exc:
        raise translate_error(exc, path, busy_timeout_s) from exc
    try:
        # Read-only inspection first: nothing is written before we know the file is ours.
        version = await _schema_version(conn, path)
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{path}: written by a newer jobsup (schema version {version}, this jobsup"
                f" knows up to {SCHEMA_VERSION}); the file was left untouched"
            )
        if writer:
            if version == 0:
                # First, before auto_vacuum and WAL (SQLite ignores it after
                # either): most bytes are log text in blobs of up to a few
                # MiB, which SQLite writes page by page (a WAL frame, then
                # the checkpoint's copy): 64 KiB pages make 16x fewer of
                # those writes than the default 4 KiB (about half the
                # writer's CPU per logged byte). Existing databases keep
                # their page size.
                await conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                # Before any table exists: freed pages can then be given back
                # to the file system (PRAGMA incremental_vacuum, retention).
                await conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            rows = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))
            if str(rows[0][0]).lower() != "wal":
                raise StoreOpenError(f"{path}: cannot switch the database to WAL mode (got {rows[0][0]})")
            # Checkpoint every ~32 MiB of WAL rather than SQLite's 1000 pages:
            # a log block is up to 8 MiB, and each checkpoint costs a sync of
            # the database.
            rows = list(await conn.execute_fetchall("PRAGMA page_size"))
            await conn.execute(f"PRAGMA wal_autocheckpoint = {max(1, _CHECKPOINT_BYTES // int(rows[0][0]))}")
            await conn.execute_fetchall(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
            if version < SCHEMA_VERSION:
                if rebuild is None:
                    raise ValueError("the writer connection needs a rebuild function for migrations")
                await _migrate(conn, path, rebuild)
            await _ensure_incremental_vacuum(conn, path)
        else:
            await conn.execute("PRAGMA query_only = ON")
        await conn.execute(f"PRAGMA synchronous = {synchronous}")
        if writer:
            # SQLite's default cache is 2,000 KiB: 31 pages of 64 KiB, less
            # than one log block of up to 8 MiB. Each block then spilled to
            # the WAL in the middle of its transaction, and the cache's page
            # buffers were freed and allocated afresh (zeroed, page-faulted)
            # every transaction. WRITER_CACHE_KIB holds a few blocks.
            await conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
    except BaseException as exc:
        await conn.close()
        if isinstance(exc, sqlite3.Error):
            raise translate_error(exc, path, busy_timeout_s) from exc
        raise
    return conn
