"""The ``output_files`` projection: every recorded output file by its sha256
(``jobsup which FILE``).

One row per file entry of each ``OutputsRecorded`` event (its ``files``:
``{path, bytes, sha256, mtime}``), keyed by ``(sha256, seq, idx)`` where
``seq`` is the event's and ``idx`` the entry's place in its list: the
files with a given digest, oldest first, are one index range read, however
many events the log holds (``which`` used to scan every OutputsRecorded
event). A full rebuild gives the same rows (the key is the event's seq and
the entry's place, both fixed by the log).

The migration that adds the table (:data:`MIGRATION_OUTPUT_FILES`) fills it
from the events already recorded with one ``INSERT ... SELECT`` over
``json_each`` (no projection rebuild); it is idempotent, so its place in
:data:`store.schema.MIGRATIONS` may change when branches are merged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from store.types import OUTPUTS_RECORDED, RecordedEvent

if TYPE_CHECKING:
    import aiosqlite

__all__ = ["OUTPUT_FILES_DDL", "OUTPUT_FILES_FILL", "apply_output_files", "outputs_by_sha256_sql"]

OUTPUT_FILES_DDL: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS output_files (
        sha256  TEXT    NOT NULL,
        seq     INTEGER NOT NULL,
        idx     INTEGER NOT NULL,
        run_id  TEXT    NOT NULL,
        path    TEXT,
        bytes   INTEGER,
        mtime   TEXT,
        at      TEXT    NOT NULL,
        PRIMARY KEY (sha256, seq, idx)
    ) WITHOUT ROWID""",
)

#: Fills ``output_files`` from the OutputsRecorded events already in the log
#: (the migration's step; ``INSERT OR IGNORE``: running it twice adds nothing).
OUTPUT_FILES_FILL: Final = (
    "INSERT OR IGNORE INTO output_files (sha256, seq, idx, run_id, path, bytes, mtime, at)"
    " SELECT lower(json_extract(f.value, '$.sha256')), e.seq, f.key, e.run_id,"
    " json_extract(f.value, '$.path'), json_extract(f.value, '$.bytes'), json_extract(f.value, '$.mtime'), e.at"
    f" FROM events AS e, json_each(e.data, '$.files') AS f WHERE e.type = '{OUTPUTS_RECORDED}'"
    " AND json_type(e.data, '$.files') = 'array'"
    # json_each's own type column first: a non-object entry's value is not JSON text.
    " AND CASE WHEN f.type = 'object' THEN json_type(f.value, '$.sha256') = 'text' ELSE 0 END"
)

_INSERT: Final = (
    "INSERT OR IGNORE INTO output_files (sha256, seq, idx, run_id, path, bytes, mtime, at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def apply_output_files(conn: aiosqlite.Connection, events: Sequence[RecordedEvent]) -> None:
    """Fold ``events`` (seq order, inside the writer's transaction) into
    ``output_files``: one row per file entry (with a text ``sha256``) of
    each OutputsRecorded event; other events cost one type comparison."""
    rows: list[tuple[Any, ...]] = []
    for e in events:
        if e.type != OUTPUTS_RECORDED:
            continue
        files = e.data.get("files")
        if not isinstance(files, list):
            continue
        for idx, f in enumerate(files):
            if not isinstance(f, dict) or not isinstance(f.get("sha256"), str):
                continue
            rows.append(
                (
                    f["sha256"].lower(),
                    e.seq,
                    idx,
                    e.run_id,
                    _text(f.get("path")),
                    _int(f.get("bytes")),
                    _text(f.get("mtime")),
                    e.at,
                )
            )
    if rows:
        await conn.executemany(_INSERT, rows)


def outputs_by_sha256_sql(digests: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
    """The query (and its parameters) of the files whose sha256 is one of
    ``digests`` (lower-case hex): rows ``(sha256, run_id, path, bytes,
    mtime, at)``, each digest's oldest first."""
    sql = (
        "SELECT sha256, run_id, path, bytes, mtime, at FROM output_files"
        " WHERE sha256 IN (SELECT value FROM json_each(?)) ORDER BY sha256, seq, idx"
    )
    return sql, (json.dumps(sorted(set(digests))),)
