"""Schema 2 -> 3: a database written by jobsup's schema-2 store (the fixture
``fixtures/v2.db``, made by ``fixtures/make_v2.py`` with the code of commit
c4db64a) opens, migrates and reads back exactly what schema 2 read
(``fixtures/v2.json``): runs, every log line with its number, stream,
source, position, text and event, and each source's newest position."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from store_helpers import lines, snapshot

from store import SCHEMA_VERSION, EventStore

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parent / "fixtures"


#: Run-object fields added after schema 2, as a run recorded then has them.
_NEW_FIELDS = {"log_ingest": None, "sweep_id": None, "labels": {}, "params": {}, "progress": None}


async def test_a_v2_database_migrates_and_replays_identically(tmp_path: Path) -> None:
    db = tmp_path / "jobsup.db"
    shutil.copy(FIXTURES / "v2.db", db)
    expected = json.loads((FIXTURES / "v2.json").read_text())
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0] == 2
    events_before = conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    conn.close()

    async with await EventStore.open(db) as store:
        for run_id, run in expected["runs"].items():
            got = await store.get_run(run_id)
            # (schema 6's facts -- started_at, gpus, usage... -- are checked in test_store_facts.py)
            shown = None if got is None else {k: v for k, v in got.to_json().items() if run is None or k in run}
            assert shown == (None if run is None else {**run, "log_ingest": None} if "log_ingest" in run else run)
            assert [ln.to_json() for ln in await store.log_lines(run_id, limit=100000)] == expected["lines"][run_id]
            for source, pos in expected["positions"][run_id].items():
                assert await store.last_log_position(run_id, source) == pos
            # plain text: the same lines, newline-terminated
            last, text = await store.log_text(run_id, 0, max_blocks=1000)
            assert text.decode() == "".join(ln["text"] + "\n" for ln in expected["lines"][run_id])
            assert last == len(expected["lines"][run_id])
        migrated = snapshot(db)
        await store.rebuild()
        assert snapshot(db) == migrated
        # appending goes on where schema 2 stopped: replays are dropped, new lines numbered on
        run = await store.get_run("aaaa00000001")
        assert run is not None
        await store.append("aaaa00000001", run.version, [lines([("41", "again"), ("52", "again"), ("60", "next")])])
        stdout = [ln.text for ln in await store.log_lines("aaaa00000001") if ln.source == "stdout"]
        assert stdout[-2:] == ["\ufffd bad", "next"]

    conn = sqlite3.connect(db)
    assert conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION == 8
    # Schema 5 switched the file to incremental vacuum (one VACUUM at the upgrade): retention can shrink it.
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    assert conn.execute("SELECT * FROM events ORDER BY seq").fetchall()[: len(events_before)] == events_before
    conn.close()
