"""Append, read and optimistic concurrency on a real SQLite file."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest
from store_helpers import lines, phase, submitted

from store import ConcurrencyError, EventStore, NewEvent, RecordedEvent, StoreClosedError

pytestmark = pytest.mark.anyio

AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


async def test_append_assigns_seq_version_and_at(store: EventStore) -> None:
    first = await store.append("aaaa00000001", 0, [submitted()])
    more = await store.append("aaaa00000001", 1, [phase("SCHEDULING"), phase("RUNNING")])
    other = await store.append("bbbb00000002", 0, [submitted(name="eval")])

    assert [(e.seq, e.version) for e in first + more] == [(1, 1), (2, 2), (3, 3)]
    assert [(e.seq, e.version) for e in other] == [(4, 1)]
    assert all(AT.match(e.at) for e in first + more + other)
    assert more[1].data == {"phase": "RUNNING"}
    assert await store.last_seq() == 4
    stream = await store.read_stream("aaaa00000001")
    assert stream == first + more
    assert await store.read_stream("aaaa00000001", from_version=3) == more[1:]
    assert await store.read_stream("unknown") == []


async def test_appended_data_reads_back_as_json(store: EventStore) -> None:
    [event] = await store.append("r1", 0, [NewEvent("StagingStep", {"step": ("a", 1), "ok": True, "none": None})])
    assert event.data == {"step": ["a", 1], "ok": True, "none": None}  # what a reader sees, not the caller's tuple
    assert (await store.read_stream("r1"))[0] == event
    assert event.to_json()["data"] == event.data


async def test_stale_expected_version_raises_and_writes_nothing(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    with pytest.raises(ConcurrencyError) as info:
        await store.append("r1", 0, [phase("RUNNING")])
    assert (info.value.run_id, info.value.expected, info.value.actual) == ("r1", 0, 1)
    with pytest.raises(ConcurrencyError):
        await store.append("r1", 5, [phase("RUNNING")])
    assert await store.last_seq() == 1
    assert len(await store.read_stream("r1")) == 1
    run = await store.get_run("r1")
    assert run is not None and run.phase == "QUEUED" and run.version == 1


async def test_conflicting_appends_in_one_batch_fail_alone(db_path: Path) -> None:
    async with await EventStore.open(db_path, commit_window_s=0.05) as store:
        outcomes: dict[str, object] = {}

        async def append(key: str, run_id: str) -> None:
            try:
                outcomes[key] = await store.append(run_id, 0, [submitted(name=key)])
            except ConcurrencyError as exc:
                outcomes[key] = exc

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(append, f"same{i}", "shared")
                tg.start_soon(append, f"own{i}", f"own{i}")

        assert store.statistics().transactions == 1  # all 20 in one batch
        winners = [k for k, v in outcomes.items() if k.startswith("same") and isinstance(v, list)]
        losers = [v for k, v in outcomes.items() if k.startswith("same") and isinstance(v, ConcurrencyError)]
        assert len(winners) == 1 and len(losers) == 9
        assert all(e.actual == 1 for e in losers)
        assert all(isinstance(outcomes[f"own{i}"], list) for i in range(10))
        shared = await store.read_stream("shared")
        assert len(shared) == 1 and shared[0].data["name"] == winners[0]
        assert await store.last_seq() == 11


async def test_concurrent_appenders_share_few_transactions_and_survive_reopen(db_path: Path) -> None:
    n = 200
    async with await EventStore.open(db_path, commit_window_s=0.05) as store:

        async def append(i: int) -> RecordedEvent:
            return (await store.append(f"run{i:04d}", 0, [submitted(name=f"t{i}")]))[0]

        results: list[RecordedEvent] = []

        async def collect(i: int) -> None:
            results.append(await append(i))

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(collect, i)
        transactions = store.statistics().transactions
        assert transactions < n / 10, transactions
        # one transaction stamps one `at`: far fewer distinct times than appends
        assert len({e.at for e in results}) == transactions
        assert sorted(e.seq for e in results) == list(range(1, n + 1))

    async with await EventStore.open(db_path) as reopened:
        page = await reopened.read_all(after_seq=0, limit=10_000)
        assert sorted((e.run_id, e.seq) for e in page) == sorted((e.run_id, e.seq) for e in results)
        assert len(await reopened.list_runs()) == n


async def test_sequential_appends_each_commit_before_returning(db_path: Path) -> None:
    async with await EventStore.open(db_path, commit_window_s=0) as store:
        for v in range(5):
            await store.append("r", v, [NewEvent("Tick", {"n": v})])
        assert store.statistics().transactions == 5
    async with await EventStore.open(db_path) as reopened:
        assert [e.data["n"] for e in await reopened.read_stream("r")] == [0, 1, 2, 3, 4]


async def test_read_all_pages_and_filters(store: EventStore) -> None:
    for i in range(5):
        await store.append(f"r{i}", 0, [submitted(), lines([(str(i), f"line {i}")]), phase("RUNNING")])
    everything = await store.read_all()
    assert [e.seq for e in everything] == list(range(1, 16))
    page1 = await store.read_all(after_seq=0, limit=4)
    page2 = await store.read_all(after_seq=page1[-1].seq, limit=4)
    assert [e.seq for e in page1 + page2] == list(range(1, 9))
    assert [e.seq for e in await store.read_all(run_id="r2")] == [7, 8, 9]
    assert [e.seq for e in await store.read_all(after_seq=7, run_id="r2")] == [8, 9]
    assert [e.run_id for e in await store.read_all(types=["PhaseChanged"])] == [f"r{i}" for i in range(5)]
    assert [e.seq for e in await store.read_all(after_seq=5, types={"Submitted", "LogLines"}, limit=3)] == [
        7,
        8,
        10,
    ]
    assert await store.read_all(types=[]) == []
    with pytest.raises(ValueError, match="limit"):
        await store.read_all(limit=0)
    with pytest.raises(TypeError, match="types"):
        await store.read_all(types="LogLines")


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (NewEvent("Submitted", {"project": "p", "name": "n"}), "Submitted event data needs key 'backend'"),
        (NewEvent("Submitted", {"project": "p", "name": 3, "backend": "local"}), r"data\['name'\] must be str"),
        (NewEvent("PhaseChanged", {"phase": "DONE"}), "must be one of QUEUED"),
        (NewEvent("PhaseChanged", {"phase": "ERROR", "exit_code": "1"}), "exit_code"),
        (NewEvent("HandleRecorded", {"handle": 12}), "handle"),
        (NewEvent("LogLines", {"stream": "stdlog", "source": "s", "lines": []}), "stream"),
        (NewEvent("LogLines", {"stream": "stdout", "source": "s", "lines": [["1"]]}), r"lines'\]\[0\]"),
        (NewEvent("LogLines", {"stream": "stdout", "source": "s", "lines": [[1, "x"]]}), r"lines'\]\[0\]"),
        (NewEvent("Tick", {"when": object()}), "not JSON-serialisable"),
        (NewEvent("Tick", {"x": float("nan")}), "not JSON-serialisable"),
        (NewEvent("LogLines", {"stream": "stdout", "source": "s", "lines": [["1", "\udc80"]]}), "serialisable"),
        (NewEvent("", {}), "non-empty"),
    ],
)
async def test_bad_events_are_refused_before_anything_is_written(
    store: EventStore, event: NewEvent, match: str
) -> None:
    await store.append("r1", 0, [submitted()])
    with pytest.raises(ValueError, match=match):
        await store.append("r1", 1, [phase("RUNNING"), event])
    assert await store.last_seq() == 1


async def test_bad_arguments(store: EventStore) -> None:
    with pytest.raises(ValueError, match="at least one event"):
        await store.append("r1", 0, [])
    with pytest.raises(ValueError, match="run_id"):
        await store.append("", 0, [submitted()])
    with pytest.raises(ValueError, match="expected_version"):
        await store.append("r1", -1, [submitted()])


async def test_closed_store_refuses_everything(db_path: Path) -> None:
    store = await EventStore.open(db_path)
    await store.append("r1", 0, [submitted()])
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        await store.append("r1", 1, [phase("RUNNING")])
    with pytest.raises(StoreClosedError):
        await store.read_stream("r1")
    with pytest.raises(StoreClosedError):
        await store.wait_for_events(0)


async def test_close_waits_for_queued_appends(db_path: Path) -> None:
    store = await EventStore.open(db_path, commit_window_s=0.05)
    done: list[int] = []

    async def append(i: int) -> None:
        await store.append(f"r{i}", 0, [submitted()])
        done.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(append, i)
        await anyio.sleep(0)  # every append is queued, none committed yet
        await store.close()
    assert sorted(done) == list(range(20))
    async with await EventStore.open(db_path) as reopened:
        assert await reopened.last_seq() == 20


async def test_a_failing_writer_fails_appends_loudly_and_never_hangs(db_path: Path) -> None:
    store = await EventStore.open(db_path)
    await store.append("r1", 0, [submitted()])

    async def broken(*args: object) -> None:
        raise RuntimeError("projection bug")

    store._writer._projector.apply = broken  # type: ignore[method-assign]
    with anyio.fail_after(10):
        with pytest.raises(StoreClosedError, match="interrupted"):
            await store.append("r1", 1, [phase("RUNNING")])
        with pytest.raises(StoreClosedError, match="projection bug"):
            await store.append("r1", 1, [phase("RUNNING")])
        assert await store.last_seq() == 1  # reads still work; nothing half-written
        await store.close()
    async with await EventStore.open(db_path) as reopened:
        assert [e.type for e in await reopened.read_stream("r1")] == ["Submitted"]
