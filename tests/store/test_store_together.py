"""``EventStore.append_together`` (a sweep and its runs, all or nothing)
and the ``run_meta`` projection (labels, sweep, params, progress)."""

from __future__ import annotations

import pytest
from store_helpers import submitted

from store import PROGRESS, SWEEP_SUBMITTED, Append, ConcurrencyError, EventStore, NewEvent

pytestmark = pytest.mark.anyio

SWEEP = "s0123456789a"


def _run(i: int, **extra: object) -> NewEvent:
    base = submitted(name=f"train[i={i}]")
    return NewEvent(base.type, {**base.data, "sweep_id": SWEEP, "sweep_index": i, "params": {"i": str(i)}, **extra})


async def test_a_sweep_and_its_runs_are_one_transaction(store: EventStore) -> None:
    before = store.statistics().transactions
    appends = [Append(SWEEP, 0, [NewEvent(SWEEP_SUBMITTED, {"grid": {"i": ["0", "1", "2"]}, "count": 3})])]
    appends += [Append(f"{i:012x}", 0, [_run(i, labels={"team": "v"})]) for i in range(3)]
    recorded = await store.append_together(appends)
    assert store.statistics().transactions == before + 1
    seqs = [events[0].seq for events in recorded]
    assert seqs == list(range(seqs[0], seqs[0] + 4)) and len({e[0].at for e in recorded}) == 1
    runs = await store.sweep_runs(SWEEP)
    assert [r.id for r in runs] == [f"{i:012x}" for i in range(3)]
    assert runs[1].sweep_id == SWEEP and runs[1].params == {"i": "1"} and runs[1].labels == {"team": "v"}
    assert await store.get_run(SWEEP) is None  # a sweep is not a run
    assert await store.match_sweep_ids("s0123") == [SWEEP]
    assert await store.match_sweep_ids("s0124") == []


async def test_one_stale_stream_records_nothing(store: EventStore) -> None:
    await store.append("000000000001", 0, [submitted()])
    last = await store.last_seq()
    appends = [Append(SWEEP, 0, [NewEvent(SWEEP_SUBMITTED, {"grid": {}, "count": 2})])]
    appends += [Append(f"{i:012x}", 0, [_run(i)]) for i in range(2)]  # the second exists already
    with pytest.raises(ConcurrencyError):
        await store.append_together(appends)
    assert await store.last_seq() == last
    assert await store.sweep_runs(SWEEP) == []
    with pytest.raises(ValueError, match="named twice"):
        await store.append_together([Append("a", 0, [submitted()]), Append("a", 0, [submitted()])])


async def test_progress_is_the_last_report_and_survives_a_rebuild(store: EventStore) -> None:
    run = "000000000009"
    await store.append(run, 0, [submitted()])
    assert (await store.get_run(run)).progress is None  # type: ignore[union-attr]
    await store.append(run, 1, [NewEvent(PROGRESS, {"step": 1}), NewEvent(PROGRESS, {"step": 2, "metrics": {"a": 1}})])
    status = await store.get_run(run)
    assert status is not None and status.progress is not None
    assert status.progress["step"] == 2 and status.progress["metrics"] == {"a": 1} and status.progress["seq"] == 3
    await store.rebuild()
    again = await store.get_run(run)
    assert again == status
    assert [r.id for r in await store.list_runs()] == [run]


async def test_page_runs_filters_by_labels_name_glob_and_sweep(store: EventStore) -> None:
    """The page's runs list (supervisord.daemon.ui): labels (each must match), a
    name glob as fnmatch reads it ([!...] too) and a sweep, in SQL."""
    from store.runqueries import sqlite_glob

    await store.append_together(
        [
            Append(SWEEP, 0, [NewEvent(SWEEP_SUBMITTED, {"grid": {"i": ["0", "1"]}, "count": 2})]),
            *(Append(f"r{i}", 0, [_run(i, labels={"team": "a"})]) for i in range(2)),
        ]
    )
    base = submitted(name="eval-b")
    await store.append("solo", 0, [NewEvent(base.type, {**base.data, "labels": {"team": "b", "k": "x"}})])

    async def ids(**kw: object) -> list[str]:
        page, _ = await store.page_runs(limit=10, **kw)  # type: ignore[arg-type]
        return sorted(r.id for r in page)

    assert await ids(labels={"team": "a"}) == ["r0", "r1"]
    assert await ids(labels={"team": "b", "k": "x"}) == ["solo"]
    assert await ids(labels={"team": "b", "k": "y"}) == []
    assert await ids(sweep_id=SWEEP) == ["r0", "r1"]
    assert await ids(name_glob="train[[]i=1]") == ["r1"]
    assert await ids(name_glob="*-[!a]") == ["solo"]
    assert await ids(name_glob="train*", labels={"team": "a"}, sweep_id=SWEEP) == ["r0", "r1"]
    assert sqlite_glob("x[!ab]*") == "x[^ab]*"
