"""The run facts projection (schema 6): times, placement and usage on every
run object, folded from Submitted, PhaseChanged, Admitted and ResourceUsage."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from store_helpers import lines, phase, submitted

from store import EventStore, NewEvent

pytestmark = pytest.mark.anyio


def _submitted_with_scheduling() -> NewEvent:
    base = submitted()
    sched = {"gpus": 2, "queue": "gpu", "priority": 7, "after": ["aaaa00000001"], "after_any": ["bbbb00000002"]}
    return NewEvent(base.type, {**base.data, "scheduling": sched})


async def test_times_placement_and_usage_are_on_the_run(store: EventStore) -> None:
    rid = "abc123def456"
    await store.append(rid, 0, [_submitted_with_scheduling()])
    run = await store.get_run(rid)
    assert run is not None
    assert (run.queue, run.priority, run.after, run.gpus) == ("gpu", 7, ["aaaa00000001", "bbbb00000002"], [])
    assert run.started_at is None and run.to_json()["elapsed_s"] is None and run.usage is None
    gpus = [{"index": 2, "uuid": "GPU-b"}, {"index": 3, "uuid": "GPU-c"}]
    await store.append(rid, 1, [NewEvent("Admitted", {"queue": "gpu", "gpus": gpus}), phase("SCHEDULING")])
    [running] = await store.append(rid, 3, [phase("RUNNING")])
    await store.append(rid, 4, [lines([("1", "x")])])  # a log batch touches no facts
    await store.append(
        rid, 5, [NewEvent("ResourceUsage", {"cpu_s": 3.5, "max_rss_bytes": 200, "gpu_memory_max_bytes": {"2": 10}})]
    )
    # a later sample with lower peaks: peaks never go down; CPU is cumulative
    await store.append(
        rid, 6, [NewEvent("ResourceUsage", {"cpu_s": 4.0, "max_rss_bytes": 100, "gpu_memory_max_bytes": {"2": 5}})]
    )
    run = await store.get_run(rid)
    assert run is not None
    assert run.gpus == [2, 3] and run.started_at == running.at and run.ended_at is None
    assert run.usage == {"cpu_s": 4.0, "max_rss_bytes": 200, "gpu_memory_max_bytes": {"2": 10}}
    elapsed = run.to_json()["elapsed_s"]
    assert isinstance(elapsed, float) and elapsed >= 0
    [ended] = await store.append(rid, 7, [phase("ERROR", reason="OOMKilled")])
    await store.append(rid, 8, [phase("RUNNING")])  # nothing after a terminal phase moves the times
    run = await store.get_run(rid)
    assert run is not None and run.ended_at == ended.at and run.started_at == running.at
    assert run.elapsed_s() == run.elapsed_s(now=0) == run.to_json()["elapsed_s"]
    # the same objects from list and page reads
    assert (await store.list_runs())[0] == run
    assert (await store.page_runs(limit=5))[0][0] == run


async def test_facts_rebuild_identically_and_old_runs_have_defaults(store: EventStore, db_path: Path) -> None:
    await store.append("r1", 0, [submitted()])  # recorded before scheduling existed
    await store.append(
        "r2", 0, [_submitted_with_scheduling(), phase("RUNNING"), NewEvent("ResourceUsage", {"cpu_s": 1})]
    )
    await store.append("r3", 0, [NewEvent("ResourceUsage", {"cpu_s": 1})])  # no Submitted: no facts
    old = await store.get_run("r1")
    assert old is not None and (old.queue, old.priority, old.gpus, old.after, old.usage) == (None, None, [], [], None)

    def facts() -> list[tuple[str, str]]:
        conn = sqlite3.connect(db_path)
        try:
            return conn.execute("SELECT * FROM run_facts ORDER BY run_id").fetchall()
        finally:
            conn.close()

    before = facts()
    assert [r[0] for r in before] == ["r1", "r2"]
    await store.rebuild()
    assert facts() == before


async def test_container_times_replace_when_jobsup_saw_the_run_start_and_end(store: EventStore, db_path: Path) -> None:
    rid = "c0ffee000001"
    times = "ContainerTimes"
    await store.append(rid, 0, [submitted(), phase("RUNNING")])
    # The container started before jobsup saw RUNNING (staging) and finished before the terminal phase.
    await store.append(
        rid, 2, [NewEvent(times, {"pod": "p1", "container": "main", "started_at": "2026-01-01T10:00:00Z"})]
    )
    await store.append(
        rid, 3, [NewEvent(times, {"pod": "p2", "container": "main", "started_at": "2026-01-01T10:05:00Z"})]
    )
    await store.append(
        rid, 4, [NewEvent(times, {"pod": "p2", "container": "main", "finished_at": "2026-01-01T10:10:30Z"})]
    )
    await store.append(rid, 5, [phase("COMPLETED")])
    run = await store.get_run(rid)
    assert run is not None
    # the first start (a replaced pod does not move it), the last finish
    assert (run.started_at, run.ended_at) == ("2026-01-01T10:00:00Z", "2026-01-01T10:10:30Z")
    assert run.elapsed_s() == 630.0
    conn = sqlite3.connect(db_path)
    try:
        before = conn.execute("SELECT * FROM run_facts").fetchall()
    finally:
        conn.close()
    await store.rebuild()
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("SELECT * FROM run_facts").fetchall() == before
    finally:
        conn.close()
