"""Reads of several runs in one query (what hook delivery uses for a batch
of events): run-status projections and first (Submitted) events; append_log
at the stream's end (expected_version None)."""

from __future__ import annotations

import pytest
from store_helpers import phase, submitted

from store import ConcurrencyError, EventStore, LogBlock, NewEvent

pytestmark = pytest.mark.anyio


async def test_get_runs_and_first_events_return_the_runs_that_exist(store: EventStore) -> None:
    for run_id in ("r1", "r2", "r3"):
        await store.append(run_id, 0, [submitted(name=run_id)])
    await store.append("r2", 1, [phase("RUNNING")])
    runs = await store.get_runs(["r2", "r1", "missing", "r2"])
    assert sorted(runs) == ["r1", "r2"]
    assert runs["r2"] == await store.get_run("r2") and runs["r2"].phase == "RUNNING"
    firsts = await store.first_events({"r1", "r2", "missing"})
    assert sorted(firsts) == ["r1", "r2"]
    assert firsts["r2"].version == 1 and firsts["r2"].type == "Submitted" and firsts["r2"].data["name"] == "r2"
    assert await store.get_runs([]) == {} and await store.first_events([]) == {}


async def test_append_log_at_the_streams_end(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    await store.append("r1", None, [NewEvent("HookDelivered", {"hook": "a"})])
    block = LogBlock.from_pairs("stdout", "stdout", [("1", "one")])
    with pytest.raises(ConcurrencyError):
        await store.append_log("r1", 1, [block])
    [event] = await store.append_log("r1", None, [block])
    assert event.version == 3 and event.type == "LogLines"
    with pytest.raises(ConcurrencyError):  # None needs an existing stream
        await store.append_log("nothing", None, [block])


async def test_read_recent_pages_backwards_with_type_filters(store: EventStore) -> None:
    block = LogBlock.from_pairs("stdout", "stdout", [("1", "one")])
    for run_id in ("r1", "r2"):
        await store.append(run_id, 0, [submitted(name=run_id)])
        await store.append_log(run_id, None, [block])
        await store.append(run_id, None, [phase("RUNNING")])
    every = await store.read_all(0, limit=100)
    newest = await store.read_recent(limit=3)
    assert [e.seq for e in newest] == [e.seq for e in reversed(every)][:3]
    older = await store.read_recent(before_seq=newest[-1].seq, limit=100)
    assert [e.seq for e in newest + older] == [e.seq for e in reversed(every)]
    quiet = await store.read_recent(limit=100, exclude_types=["LogLines"])
    assert [e.type for e in quiet] == ["PhaseChanged", "Submitted", "PhaseChanged", "Submitted"]
    mine = await store.read_recent(limit=100, run_id="r1", exclude_types=["LogLines"])
    assert [(e.run_id, e.version) for e in mine] == [("r1", 3), ("r1", 1)]
    logs = await store.read_recent(limit=100, types=["LogLines"])
    assert [e.run_id for e in logs] == ["r2", "r1"]
    assert await store.read_recent(limit=5, types=[]) == []
    with pytest.raises(ValueError):
        await store.read_recent(limit=0)
