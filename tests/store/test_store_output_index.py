"""The ``output_files`` projection (store.outputindex): output files by
sha256 for ``jobsup which``, kept by the projector, filled by its migration
from a database that already has OutputsRecorded events, and the same
after a full rebuild."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from store_helpers import submitted

from store import OUTPUTS_RECORDED, SCHEMA_VERSION, EventStore, NewEvent
from store.schema import MIGRATIONS

pytestmark = pytest.mark.anyio

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _outputs(*files: tuple[str, str, int]) -> NewEvent:
    return NewEvent(
        OUTPUTS_RECORDED,
        {
            "dir": "/out",
            "files": [
                {"path": p, "bytes": n, "sha256": sha, "mtime": "2026-12-01T00:00:00.000000Z"} for p, sha, n in files
            ],
            "total_bytes": sum(n for _, _, n in files),
            "total_files": len(files),
        },
    )


def _rows(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT * FROM output_files ORDER BY sha256, seq, idx").fetchall()
    finally:
        conn.close()


async def test_files_are_found_by_sha256_oldest_first_and_rebuild_gives_the_same_rows(db_path: Path) -> None:
    async with await EventStore.open(db_path) as store:
        await store.append("r1", 0, [submitted(), _outputs(("model.pkl", A, 10), ("log.txt", B, 3))])
        await store.append("r2", 0, [submitted(), _outputs(("copy/model.pkl", A, 10))])
        await store.append("r3", 0, [submitted(), NewEvent(OUTPUTS_RECORDED, {"dir": "/o", "files": []})])
        found = await store.outputs_by_sha256([A, C])
        assert set(found) == {A}
        assert [(m["run"], m["path"], m["bytes"]) for m in found[A]] == [
            ("r1", "model.pkl", 10),
            ("r2", "copy/model.pkl", 10),
        ]
        assert found[A][0]["mtime"] == "2026-12-01T00:00:00.000000Z" and found[A][0]["recorded_at"]
        assert (await store.outputs_by_sha256([B]))[B][0]["path"] == "log.txt"
        before = _rows(db_path)
        await store.rebuild()
    assert _rows(db_path) == before and len(before) == 3


async def test_the_migration_indexes_the_outputs_already_recorded(db_path: Path) -> None:
    # A database at the schema version before output_files, with events.
    async with await EventStore.open(db_path) as store:
        await store.append("r1", 0, [submitted(), _outputs(("model.pkl", A, 10), ("x", B, 1))])
        await store.append("r2", 0, [submitted(), _outputs(("m2.pkl", A, 10))])
        want = await store.outputs_by_sha256([A, B])
    index = next(i for i, m in enumerate(MIGRATIONS) if "output_files" in m.title)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("DROP TABLE output_files")
    conn.execute("DELETE FROM schema_migrations WHERE version > ?", (index,))
    conn.close()
    assert "output_files" not in _tables(db_path)

    async with await EventStore.open(db_path) as store:
        assert await store.outputs_by_sha256([A, B]) == want
        assert [m["run"] for m in want[A]] == ["r1", "r2"]
    conn = sqlite3.connect(db_path)
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    conn.close()
    assert versions == list(range(1, SCHEMA_VERSION + 1))


async def test_the_fill_statement_is_idempotent_and_skips_malformed_entries(db_path: Path) -> None:
    from store.outputindex import OUTPUT_FILES_FILL

    async with await EventStore.open(db_path) as store:
        bad = NewEvent(OUTPUTS_RECORDED, {"dir": "/o", "files": ["not an object", {"path": "nosha"}]})
        await store.append("r1", 0, [submitted(), _outputs(("m", C, 1)), bad])
    before = _rows(db_path)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute(OUTPUT_FILES_FILL)
    conn.execute(OUTPUT_FILES_FILL)
    conn.close()
    assert _rows(db_path) == before and [r[0] for r in before] == [C]


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def test_the_event_type_is_the_catalogs() -> None:
    from supervisord.shared.events import OUTPUTS_RECORDED as declared

    assert json.dumps(OUTPUTS_RECORDED) == json.dumps(declared)
