"""Faults: a full disk, a second process on the same file, a held lock."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import anyio
import pytest
from store_helpers import lines, phase, snapshot, submitted

from store import ConcurrencyError, EventStore, NewEvent, StorageFullError, StoreLockedError

pytestmark = pytest.mark.anyio

HELPER = str(Path(__file__).with_name("store_proc.py"))


async def test_full_disk_fails_the_batch_cleanly_and_recovers(db_path: Path) -> None:
    async with await EventStore.open(db_path, commit_window_s=0.05) as store:
        await store.append("r1", 0, [submitted(), lines([(str(i), "x" * 200) for i in range(50)])])
        before = snapshot(db_path)
        page_count = next(iter(await store._writer_conn.execute_fetchall("PRAGMA page_count")))[0]
        await store._writer_conn.execute(f"PRAGMA max_page_count = {page_count + 2}")

        big = lines([(str(1000 + i), "y" * 1000) for i in range(500)])
        outcomes: dict[str, BaseException] = {}

        async def append(key: str, run_id: str, version: int, event: NewEvent) -> None:
            try:
                await store.append(run_id, version, [event])
            except (StorageFullError, ConcurrencyError) as exc:
                outcomes[key] = exc

        async with anyio.create_task_group() as tg:  # one batch: a big append, a small one, a stale one
            tg.start_soon(append, "big", "r1", 2, big)
            tg.start_soon(append, "small", "r2", 0, submitted())
            tg.start_soon(append, "stale", "r1", 0, phase("RUNNING"))
        assert isinstance(outcomes["big"], StorageFullError) and str(db_path) in str(outcomes["big"])
        assert isinstance(outcomes["small"], StorageFullError)
        assert isinstance(outcomes["stale"], ConcurrencyError)

        assert await store.last_seq() == 2
        assert snapshot(db_path) == before
        run = await store.get_run("r1")
        assert run is not None and run.version == 2 and run.log_lines == 50

        await store._writer_conn.execute("PRAGMA max_page_count = 1073741823")  # space returns
        await store.append("r1", 2, [big])
        await store.append("r2", 0, [submitted()])
        run = await store.get_run("r1")
        assert run is not None and run.log_lines == 550

    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert conn.execute("SELECT seq FROM events ORDER BY seq").fetchall() == [(1,), (2,), (3,), (4,)]
    conn.close()


async def test_two_processes_append_to_the_same_database(db_path: Path) -> None:
    n = 150
    async with await EventStore.open(db_path, busy_timeout_s=30) as store:
        await store.append("shared", 0, [NewEvent("Tick", {"by": "init"})])
        child_output: list[str] = []

        async def child() -> None:
            result = await anyio.run_process([sys.executable, HELPER, "append", str(db_path), "proc", str(n)])
            child_output.append(result.stdout.decode())

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
                shared_version = 1
                for i in range(n):
                    await store.append("here", i, [NewEvent("Tick", {"by": "here", "n": i})])
                    while True:
                        try:
                            await store.append("shared", shared_version, [NewEvent("Tick", {"by": "here", "n": i})])
                            shared_version += 1
                            break
                        except ConcurrencyError as exc:
                            shared_version = exc.actual
        assert child_output[0].splitlines()[-1] == "done"  # (structlog writes to stdout before that)

    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    rows = conn.execute("SELECT seq, run_id, version, data FROM events ORDER BY seq").fetchall()
    conn.close()
    assert [r[0] for r in rows] == list(range(1, 1 + 1 + 4 * n))
    for run_id in ("here", "proc", "shared"):
        versions = [r[2] for r in rows if r[1] == run_id]
        assert versions == list(range(1, len(versions) + 1))
    shared = [r[3] for r in rows if r[1] == "shared"]
    assert len(shared) == 1 + 2 * n
    assert sum('"by":"proc"' in d for d in shared) == n and sum('"by":"here"' in d for d in shared) == n

    before = snapshot(db_path)
    async with await EventStore.open(db_path) as store:
        await store.rebuild()
    assert snapshot(db_path) == before


async def test_a_held_lock_gives_a_clear_error_then_writes_resume(db_path: Path) -> None:
    async with await EventStore.open(db_path, busy_timeout_s=0.3) as store:
        await store.append("r1", 0, [submitted()])
        async with await anyio.open_process([sys.executable, HELPER, "lock", str(db_path)]) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            output = b""
            with anyio.fail_after(30):
                while not output.endswith(b"\n"):
                    output += await proc.stdout.receive()
            assert output == b"locked\n"
            with pytest.raises(StoreLockedError, match=str(db_path)):
                await store.append("r1", 1, [phase("RUNNING")])
            # readers are not blocked by a writer (WAL), and a second store can still open
            assert await store.last_seq() == 1
            async with await EventStore.open(db_path, busy_timeout_s=0.3) as second:
                assert await second.last_seq() == 1
            await proc.stdin.aclose()
            with anyio.fail_after(30):
                assert await proc.wait() == 0
        await store.append("r1", 1, [phase("RUNNING")])
        run = await store.get_run("r1")
        assert run is not None and run.phase == "RUNNING"


async def test_wait_for_storage_retries_through_a_full_disk_and_a_held_lock(db_path: Path) -> None:
    """Appends with ``wait_for_storage`` are held and retried (with back-off)
    while the disk is full or another process holds the lock, and written
    once storage works; ``storage_problem`` says why meanwhile. A fail-fast
    append in the same batches still fails at once."""
    async with await EventStore.open(db_path, busy_timeout_s=0.3, commit_window_s=0.01) as store:
        await store.append("r1", 0, [submitted()])
        page_count = next(iter(await store._writer_conn.execute_fetchall("PRAGMA page_count")))[0]
        await store._writer_conn.execute(f"PRAGMA max_page_count = {page_count + 1}")
        done: list[int] = []

        async def waiting(version: int) -> None:
            recorded = await store.append(
                "r1",
                version,
                [lines([(str(version * 1000 + i), "y" * 1000) for i in range(300)])],
                wait_for_storage=True,
            )
            done.append(recorded[-1].version)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting, 1)
            with anyio.fail_after(30):
                while store.storage_problem() is None:
                    await anyio.sleep(0.05)
            problem = store.storage_problem()
            assert problem is not None and problem["kind"] == "disk full" and problem["waiting"] == 1
            with pytest.raises(StorageFullError):  # no wait: fails alone
                await store.append("r2", 0, [lines([(str(i), "z" * 1000) for i in range(300)])])
            await anyio.sleep(1.0)
            assert done == []
            await store._writer_conn.execute("PRAGMA max_page_count = 1073741823")  # space returns
        assert done == [2] and store.storage_problem() is None

        async with await anyio.open_process([sys.executable, HELPER, "lock", str(db_path)]) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            output = b""
            with anyio.fail_after(30):
                while not output.endswith(b"\n"):
                    output += await proc.stdout.receive()
            assert output == b"locked\n"
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting, 2)
                with anyio.fail_after(30):
                    while store.storage_problem() is None:
                        await anyio.sleep(0.05)
                problem = store.storage_problem()
                assert problem is not None and problem["kind"] == "locked" and str(db_path) in problem["message"]
                await anyio.sleep(1.0)  # several busy timeouts
                assert done == [2]
                await proc.stdin.aclose()
            assert await proc.wait() == 0
        assert done == [2, 3] and store.storage_problem() is None
        run = await store.get_run("r1")
        assert run is not None and run.version == 3 and run.log_lines == 600
