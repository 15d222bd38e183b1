"""wait_for_events / subscribe: immediate, woken by commits, race-free, no polling."""

from __future__ import annotations

import random
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from store_helpers import phase, submitted

from store import EventStore, NewEvent, RecordedEvent, StoreClosedError

pytestmark = pytest.mark.anyio

HELPER = str(Path(__file__).with_name("store_proc.py"))


def _reads(store: EventStore) -> int:
    """How many queries the store's readers have run (its statistics)."""
    return store.statistics().reads


async def test_wait_returns_already_committed_events_at_once(store: EventStore) -> None:
    await store.append("r1", 0, [submitted(), phase("RUNNING")])
    await store.append("r2", 0, [submitted()])
    got = await store.wait_for_events(0, timeout_s=0)
    assert [e.seq for e in got] == [1, 2, 3]
    assert [e.seq for e in await store.wait_for_events(1, run_ids=["r1"])] == [2]
    assert [e.seq for e in await store.wait_for_events(0, types=["Submitted"], limit=1)] == [1]


async def test_wait_sleeps_without_polling_until_a_commit(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    reads = _reads(store)
    got: list[RecordedEvent] = []

    async def wait() -> None:
        got.extend(await store.wait_for_events(1, run_ids=["r1"], timeout_s=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.3)
        assert got == [] and _reads(store) == reads  # cursor at the head: registered, no query, no polling
        [event] = await store.append("r1", 1, [phase("RUNNING")])
        # the waiter is woken before append returns (notified right after COMMIT)
        await anyio.sleep(0)
    assert got == [event] and _reads(store) == reads


async def test_recent_events_answer_a_recheck_without_a_query(db_path: Path) -> None:
    async with await EventStore.open(db_path, recent_events=7) as store:
        for i in range(10):  # seqs 2i+1, 2i+2 for run ri, one commit each
            await store.append(f"r{i}", 0, [submitted(), phase("RUNNING")])
        await store.append("r0", 2, [NewEvent("Tick")])  # seq 21; memory keeps whole commits: seqs 15..21
        reads = _reads(store)
        assert [(e.run_id, e.type) for e in await store.wait_for_events(17, timeout_s=0)] == [
            ("r8", "PhaseChanged"), ("r9", "Submitted"), ("r9", "PhaseChanged"), ("r0", "Tick"),
        ]  # fmt: skip
        assert [e.seq for e in await store.wait_for_events(14, run_ids=["r7", "r0"], timeout_s=0)] == [15, 16, 21]
        assert [e.seq for e in await store.wait_for_events(14, run_ids=["r8"], limit=1)] == [17]
        assert [e.seq for e in await store.wait_for_events(14, types=["Tick"], timeout_s=0)] == [21]
        assert await store.wait_for_events(14, run_ids=["r1"], timeout_s=0) == []
        assert _reads(store) == reads
        # further behind than memory reaches: the database answers
        assert [e.seq for e in await store.wait_for_events(13, run_ids=["r6", "r0"], timeout_s=0)] == [14, 21]
        assert _reads(store) == reads + 1


async def test_wait_times_out_with_an_empty_list(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    assert await store.wait_for_events(1, timeout_s=0.05) == []
    assert await store.wait_for_events(0, run_ids=["other"], timeout_s=0.05) == []
    assert await store.wait_for_events(0, types=["PhaseChanged"], timeout_s=0.05) == []


async def test_filters_route_events_to_the_right_waiters(db_path: Path) -> None:
    async with await EventStore.open(db_path, commit_window_s=0.05) as store:
        for run_id in ("a", "b", "c"):
            await store.append(run_id, 0, [submitted()])
        got: dict[str, list[RecordedEvent]] = {}

        async def wait(key: str, **filters: Any) -> None:
            got[key] = await store.wait_for_events(3, timeout_s=30, **filters)

        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(wait, "a", run_ids=["a"]))
            tg.start_soon(partial(wait, "a+b", run_ids=["a", "b"]))
            tg.start_soon(partial(wait, "phase", types=["PhaseChanged"]))
            tg.start_soon(partial(wait, "b-phase", run_ids=["b"], types=["PhaseChanged"]))
            tg.start_soon(partial(wait, "any", limit=2))
            await anyio.sleep(0.05)
            async with anyio.create_task_group() as batch:  # one transaction
                batch.start_soon(store.append, "b", 1, [NewEvent("Tick"), phase("RUNNING")])
                batch.start_soon(store.append, "a", 1, [NewEvent("Tick")])
            assert store.statistics().transactions == 4
            assert set(got) == {"a", "a+b", "phase", "b-phase", "any"}

        def seqs(key: str) -> list[tuple[str, str]]:
            return [(e.run_id, e.type) for e in got[key]]

        assert seqs("a") == [("a", "Tick")]
        assert seqs("a+b") == [("b", "Tick"), ("b", "PhaseChanged"), ("a", "Tick")]
        assert seqs("phase") == [("b", "PhaseChanged")]
        assert seqs("b-phase") == [("b", "PhaseChanged")]
        assert seqs("any") == [("b", "Tick"), ("b", "PhaseChanged")]


@pytest.mark.parametrize("recent_events", [2048, 3, 0], ids=["memory", "small-memory", "database"])
async def test_randomized_interleavings_never_lose_a_wakeup(db_path: Path, recent_events: int) -> None:
    rng = random.Random(42)
    runs = [f"run{i}" for i in range(8)]
    # recent_events: where re-checks find recent events (memory or the database)
    async with await EventStore.open(
        db_path, synchronous="OFF", commit_window_s=0, recent_events=recent_events
    ) as store:
        versions = {r: (await store.append(r, 0, [submitted()]))[-1].version for r in runs}
        # Widen the race windows: the waiter's re-check read may be slow to start and
        # slow to come back, so commits land before, during and after it.
        query = store._query_events

        async def slow_query(*args: Any) -> list[RecordedEvent]:
            await anyio.sleep(rng.choice([0, 0, 0.001, 0.003]))
            found = await query(*args)
            await anyio.sleep(rng.choice([0, 0, 0.001, 0.003]))
            return found

        store._query_events = slow_query  # type: ignore[method-assign,assignment]
        for _ in range(200):
            target = rng.choice(runs)
            head = await store.last_seq()
            after = head - rng.choice([0, 0, 0, 1, 2])  # mostly at the head, sometimes behind
            filters: dict[str, Any] = rng.choice(
                [{}, {"run_ids": [target]}, {"run_ids": [target, rng.choice(runs)]}, {"types": ["Tick"]}]
            )
            got: list[RecordedEvent] = []
            delays = rng.choice([0, 0, 0.001, 0.002, 0.004]), rng.choice([0, 0, 0.001, 0.002, 0.004])

            async def waiter() -> None:
                await anyio.sleep(delays[0])
                got.extend(await store.wait_for_events(after, timeout_s=5, **filters))

            async def appender() -> None:
                await anyio.sleep(delays[1])
                versions[target] = (await store.append(target, versions[target], [NewEvent("Tick")]))[-1].version

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                tg.start_soon(appender)
            expected = [
                e
                for e in await store.read_all(after_seq=after)
                if ("run_ids" not in filters or e.run_id in filters["run_ids"])
                and ("types" not in filters or e.type in filters["types"])
            ]
            assert got, f"lost wake-up: waited after seq {after} with {filters}, appended to {target}"
            assert got == expected[: len(got)]  # a prefix of what is there, in seq order


async def test_events_from_another_process_wake_waiters_at_the_next_local_commit(db_path: Path) -> None:
    async with await EventStore.open(db_path) as store:
        await store.append("local", 0, [submitted()])
        got: list[RecordedEvent] = []

        async def wait() -> None:
            got.extend(await store.wait_for_events(1, run_ids=["proc"], timeout_s=60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            with anyio.fail_after(60):
                await anyio.run_process([sys.executable, HELPER, "append", str(db_path), "proc", "1"])
            assert got == []  # not notified across processes...
            await store.append("local", 1, [phase("RUNNING")])  # ...until a local commit shows the seq gap
        assert [(e.run_id, e.seq) for e in got] == [("proc", 2)]


async def test_a_cancelled_wait_leaves_nothing_registered(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    with anyio.move_on_after(0.05) as scope:
        await store.wait_for_events(1, run_ids=["r1"])
    assert scope.cancelled_caught
    with anyio.move_on_after(0.05):
        await store.wait_for_events(1, timeout_s=30)
    assert (store.statistics().waiters, store.statistics().waited_runs) == (0, 0)
    await store.append("r1", 1, [phase("RUNNING")])  # publishing to nobody is fine
    assert [e.seq for e in await store.wait_for_events(1, run_ids=["r1"], timeout_s=1)] == [2]


async def test_close_wakes_waiters_with_store_closed(db_path: Path) -> None:
    store = await EventStore.open(db_path)
    errors: list[BaseException] = []

    async def wait() -> None:
        try:
            await store.wait_for_events(0, timeout_s=30)
        except StoreClosedError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(wait)
        await anyio.sleep(0.05)
        await store.close()
    assert len(errors) == 3


async def test_statistics_count_commits_reads_and_waiters(store: EventStore) -> None:
    first = store.statistics()
    assert (first.last_seq, first.transactions, first.waiters, first.waited_runs) == (0, 0, 0, 0)
    await store.append("r1", 0, [submitted()])
    await store.read_stream("r1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(store.wait_for_events, 1, run_ids=["r1", "r2"], timeout_s=30))
        tg.start_soon(partial(store.wait_for_events, 1, run_ids=["r2"], timeout_s=30))
        tg.start_soon(partial(store.wait_for_events, 1, timeout_s=30))
        with anyio.fail_after(30):
            while store.statistics().waiters < 3:
                await anyio.sleep(0.01)
        assert store.statistics().waited_runs == 2  # r1 and r2
        await store.append("r2", 0, [submitted()])
    stats = store.statistics()
    assert (stats.last_seq, stats.transactions, stats.waiters, stats.waited_runs) == (2, 2, 0, 0)
    assert stats.reads > first.reads and stats.storage_incidents == 0


async def test_subscribe_yields_every_matching_event_in_order(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    seen: list[tuple[str, int]] = []

    async def follow() -> None:
        async for event in store.subscribe(0, run_ids=["r1", "r2"]):
            seen.append((event.run_id, event.version))
            if len(seen) == 6:
                return

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await store.append("r2", 0, [submitted()])
            await store.append("other", 0, [submitted()])
            await store.append("r1", 1, [phase("RUNNING"), phase("COMPLETED")])
            await store.append("r2", 1, [NewEvent("Tick"), NewEvent("Tick")])
    assert seen == [("r1", 1), ("r2", 1), ("r1", 2), ("r1", 3), ("r2", 2), ("r2", 3)]
