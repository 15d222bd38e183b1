"""Opening, migrations, refusing foreign files, and the append-only schema."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from store_helpers import lines, submitted

from store import SCHEMA_VERSION, EventStore, NotADatabaseError, SchemaTooNewError, StoreOpenError
from store.schema import MIGRATIONS

pytestmark = pytest.mark.anyio


async def _make_db(path: Path) -> None:
    async with await EventStore.open(path) as store:
        await store.append("r1", 0, [submitted()])
        await store.append("r2", 0, [submitted()])


async def test_open_creates_file_folder_and_schema(db_path: Path) -> None:
    assert not db_path.parent.exists()
    async with await EventStore.open(db_path) as store:
        assert store.path == db_path.absolute()
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [
        (v,) for v in range(1, SCHEMA_VERSION + 1)
    ]
    conn.close()


async def test_reopen_keeps_events_and_does_not_migrate_again(db_path: Path) -> None:
    await _make_db(db_path)
    async with await EventStore.open(db_path) as store:
        assert await store.last_seq() == 2
        await store.append("r1", 1, [submitted()])
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
    conn.close()


async def test_empty_file_is_initialised(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"")
    async with await EventStore.open(db_path) as store:
        assert await store.last_seq() == 0


async def test_a_new_database_has_64k_pages_and_an_old_one_keeps_its_own(db_path: Path, tmp_path: Path) -> None:
    # New: 64 KiB pages (log blobs are written in 16x fewer pages); the WAL
    # is checkpointed every 32 MiB whatever the page size.
    async with await EventStore.open(db_path) as store:
        await store.append("r1", 0, [submitted()])
        assert (await store.database_pages())["page_size"] == 65536
        rows = list(await store._writer_conn.execute_fetchall("PRAGMA wal_autocheckpoint"))
        assert rows[0][0] == (32 << 20) // 65536
    # A database made by an older jobsup (4 KiB pages) keeps them.
    old = tmp_path / "old" / "jobsup.db"
    old.parent.mkdir()
    shutil.copyfile(Path(__file__).parent / "fixtures" / "v2.db", old)
    async with await EventStore.open(old) as store:
        await store.append("r1", 0, [submitted()])
        assert (await store.database_pages())["page_size"] == 4096
        rows = list(await store._writer_conn.execute_fetchall("PRAGMA wal_autocheckpoint"))
        assert rows[0][0] == (32 << 20) // 4096


async def test_an_older_schema_is_migrated_forward_with_its_projections_rebuilt(db_path: Path) -> None:
    # A database as schema version 1 left it: events, and v1's projection tables.
    db_path.parent.mkdir(parents=True)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
    for statement in MIGRATIONS[0].statements:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_migrations VALUES (1, 'then')")
    events = [
        ("r1", "Submitted", {"project": "p", "name": "n", "backend": "local"}),
        ("r1", "LogLines", {"stream": "stdout", "source": "stdout", "lines": [["3", "a"], ["6", "b"]]}),
        ("r1", "PhaseChanged", {"phase": "COMPLETED", "exit_code": 0}),
    ]
    for seq, (run_id, etype, data) in enumerate(events, 1):
        conn.execute(
            "INSERT INTO events VALUES (?, ?, ?, ?, '2026-01-01T00:00:00.000000Z', ?)",
            (seq, run_id, seq, etype, json.dumps(data)),
        )
    conn.close()

    async with await EventStore.open(db_path) as store:
        run = await store.get_run("r1")
        assert run is not None and (run.phase, run.exit_code, run.log_lines, run.version) == ("COMPLETED", 0, 2, 3)
        assert [(ln.line_no, ln.pos, ln.text) for ln in await store.log_lines("r1")] == [(1, "3", "a"), (2, "6", "b")]
        await store.append("r1", 3, [lines([("6", "b"), ("9", "c")])])
        assert [ln.text for ln in await store.log_lines("r1")] == ["a", "b", "c"]
    conn = sqlite3.connect(db_path)
    assert [r[0] for r in conn.execute("SELECT version FROM schema_migrations")] == list(range(1, SCHEMA_VERSION + 1))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "log_lines" not in tables and "log_positions" not in tables and "log_blocks" in tables
    conn.close()


@pytest.mark.parametrize(("synchronous", "level"), [("FULL", 2), ("NORMAL", 1), ("OFF", 0)])
async def test_synchronous_is_applied_to_the_writer(db_path: Path, synchronous: str, level: int) -> None:
    async with await EventStore.open(db_path, synchronous=synchronous) as store:  # type: ignore[arg-type]
        rows = await store._writer_conn.execute_fetchall("PRAGMA synchronous")
        assert next(iter(rows))[0] == level


async def test_the_writer_caches_a_few_log_blocks(db_path: Path) -> None:
    """A log block of 8 MiB fits the writer's page cache (SQLite's default
    2,000 KiB made each block spill and its page buffers be allocated and
    page-faulted afresh every transaction)."""
    from store.schema import WRITER_CACHE_KIB

    async with await EventStore.open(db_path) as store:
        rows = await store._writer_conn.execute_fetchall("PRAGMA cache_size")
        assert next(iter(rows))[0] == -WRITER_CACHE_KIB
        assert WRITER_CACHE_KIB * 1024 >= 2 * (8 << 20)


async def test_bad_open_arguments(db_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        await EventStore.open(db_path, synchronous="EXTRA")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="commit_window_s"):
        await EventStore.open(db_path, commit_window_s=-1)
    assert not db_path.exists()


async def test_events_refuse_update_and_delete(db_path: Path) -> None:
    await _make_db(db_path)
    conn = sqlite3.connect(db_path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only: UPDATE"):
        conn.execute("UPDATE events SET type = 'Forged' WHERE seq = 1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only: DELETE"):
        conn.execute("DELETE FROM events WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match="append-only: DELETE"):
        conn.execute("DELETE FROM events")
    # inserts must extend the order: no reused seq, no gap or repeat in a run's versions
    with pytest.raises(sqlite3.IntegrityError, match="seq must increase"):
        conn.execute("INSERT INTO events VALUES (1, 'r9', 1, 'X', 'now', '{}')")
    with pytest.raises(sqlite3.IntegrityError, match="seq must increase"):
        conn.execute("INSERT INTO events VALUES (10, 'r1', 3, 'X', 'now', '{}')")
    conn.rollback()
    assert conn.execute("SELECT seq, run_id, version, type FROM events ORDER BY seq").fetchall() == [
        (1, "r1", 1, "Submitted"),
        (2, "r2", 1, "Submitted"),
    ]
    conn.close()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


async def test_newer_schema_is_refused_and_left_untouched(db_path: Path) -> None:
    await _make_db(db_path)
    conn = sqlite3.connect(db_path)
    conn.execute("INSERT INTO schema_migrations VALUES (?, 'future')", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    before = db_path.read_bytes()
    with pytest.raises(SchemaTooNewError) as info:
        await EventStore.open(db_path)
    assert str(db_path) in str(info.value) and f"schema version {SCHEMA_VERSION + 1}" in str(info.value)
    assert db_path.read_bytes() == before


@pytest.mark.parametrize(
    "content",
    [
        b"name: not a database\n",
        os.urandom(8192),
        b"\x00" * 4096,
    ],
    ids=["yaml", "random", "zeros"],
)
async def test_non_sqlite_file_is_refused_and_left_untouched(db_path: Path, content: bytes) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(content)
    with pytest.raises(NotADatabaseError) as info:
        await EventStore.open(db_path)
    assert str(db_path) in str(info.value)
    assert _files(db_path.parent) == {db_path.name: content}


async def test_corrupt_sqlite_file_is_refused_and_left_untouched(db_path: Path) -> None:
    await _make_db(db_path)
    data = bytearray(db_path.read_bytes())
    data[16:100] = os.urandom(84)  # page size, counters, schema cookie: garbage behind a valid magic string
    data[100:] = os.urandom(len(data) - 100)
    db_path.write_bytes(bytes(data))
    with pytest.raises(NotADatabaseError) as info:
        await EventStore.open(db_path)
    assert str(db_path) in str(info.value)
    assert db_path.read_bytes() == bytes(data)


async def test_someone_elses_sqlite_database_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    before = db_path.read_bytes()
    with pytest.raises(StoreOpenError, match="not a jobsup one.*invoices"):
        await EventStore.open(db_path)
    assert db_path.read_bytes() == before


async def test_directory_is_refused(db_path: Path) -> None:
    db_path.mkdir(parents=True)
    with pytest.raises(NotADatabaseError, match="directory"):
        await EventStore.open(db_path)


async def test_the_wal_is_cut_back_after_a_checkpoint(db_path: Path) -> None:
    """C14: the WAL kept its largest size for good (33 MB for 19 MB of
    text, refilling a disk the user had freed); after a checkpoint SQLite
    now cuts it back to WAL_SIZE_LIMIT_BYTES when it starts it over."""
    from store.schema import WAL_SIZE_LIMIT_BYTES

    wal = db_path.with_name(db_path.name + "-wal")
    async with await EventStore.open(db_path) as store:
        await store.append("r1", 0, [submitted()])
        text = "x" * 60_000
        sizes = []
        for i in range(10):  # 36 MB of text: past the 32 MiB automatic checkpoint
            await store.append("r1", None, [lines([(str(i * 60 + k), text) for k in range(60)])])
            sizes.append(wal.stat().st_size)
        for i in range(3):  # small appends after it: SQLite starts the WAL over
            await store.append("r1", None, [lines([(str(10_000 + i), "after")])])
        sizes.append(wal.stat().st_size)
    # Cut back at the restart after the checkpoint, then grown by the
    # appends after it (without the limit it stays at its peak, ~36 MB).
    assert max(sizes) > 30 << 20, sizes
    assert sizes[-1] < (16 << 20) < max(sizes), sizes
    assert any(later < WAL_SIZE_LIMIT_BYTES + (5 << 20) for later in sizes[sizes.index(max(sizes)) + 1 :]), sizes
