"""A second process on the same database, driven by the store tests.

python store_proc.py append DB RUN_ID COUNT   append COUNT events to RUN_ID and
                                              COUNT to the run "shared" (retrying
                                              on ConcurrencyError); print "done"
python store_proc.py archive DB RUN_ID         archive the run's log text (JOBSUP_FAULT_ARCHIVE
                                              may kill it midway); print "done"
python store_proc.py lock DB                  hold the write lock (BEGIN IMMEDIATE),
                                              print "locked", release on stdin EOF
"""

from __future__ import annotations

import sqlite3
import sys

import anyio

from store import ConcurrencyError, EventStore, NewEvent


async def append(db: str, run_id: str, count: int) -> None:
    async with await EventStore.open(db, busy_timeout_s=30) as store:
        shared_version = len(await store.read_stream("shared"))
        for i in range(count):
            await store.append(run_id, i, [NewEvent("Tick", {"by": run_id, "n": i})])
            while True:
                try:
                    await store.append("shared", shared_version, [NewEvent("Tick", {"by": run_id, "n": i})])
                    shared_version += 1
                    break
                except ConcurrencyError as exc:
                    shared_version = exc.actual
    print("done", flush=True)


async def archive(db: str, run_id: str) -> None:
    async with await EventStore.open(db) as store:
        await store.archive_logs(run_id)
        while await store.vacuum_step(64):
            pass
    print("done", flush=True)


def lock(db: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.read()
    conn.execute("ROLLBACK")
    conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "append":
        anyio.run(append, sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "archive":
        anyio.run(archive, sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "lock":
        lock(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
