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
