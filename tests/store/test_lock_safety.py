"""Regression: opening the store must never drop this process's SQLite locks.

Closing any descriptor of the database file drops every POSIX lock the
process holds on it (fcntl(2)). A store that did so while its writer was open
let a second process believe it was the last user: on close it checkpointed
and deleted the live WAL, and later commits of the first store were lost.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from store import EventStore, NewEvent

pytestmark = pytest.mark.anyio

_OTHER = """
import anyio, sys
from store import EventStore
async def main():
    store = await EventStore.open(sys.argv[1])
    n = len(await store.read_all(0, limit=100))
    await store.close()
    print("COUNT", n, file=sys.stderr)
anyio.run(main, backend="asyncio")
"""


def _count_in_other_process(db: Path) -> int:
    r = subprocess.run([sys.executable, "-c", _OTHER, str(db)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(next(l for l in r.stderr.splitlines() if l.startswith("COUNT")).split()[1])


async def test_other_process_open_close_keeps_our_wal(tmp_path: Path) -> None:
    db = tmp_path / "jobsup.db"
    async with await EventStore.open(db) as store:
        await store.append("a" * 12, 0, [NewEvent("Submitted", {"project": "p", "name": "n", "backend": "local"})])
        assert _count_in_other_process(db) == 1
        # The other process opened and closed the database while we hold it:
        # our WAL must still be there, and what we commit next must be visible.
        assert db.with_name("jobsup.db-wal").exists()
        await store.append("a" * 12, 1, [NewEvent("Note", {})])
        assert _count_in_other_process(db) == 2
