"""Subscriber checkpoints: moved with an append in one transaction, forward
only, kept across reopen and rebuild, added to older databases by migration."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest
from store_helpers import phase, submitted

from store import Append, Checkpoint, ConcurrencyError, EventStore, NewEvent, StoreClosedError
from store.schema import MIGRATION_CHECKPOINTS, MIGRATIONS

pytestmark = pytest.mark.anyio


async def test_checkpoint_moves_with_the_appended_events(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    assert await store.get_checkpoint("hook:a") is None
    [event] = await store.append(
        "r1", None, [NewEvent("HookDelivered", {"hook": "a"})], checkpoint=Checkpoint("hook:a", 1)
    )
    assert event.version == 2
    assert await store.get_checkpoint("hook:a") == 1
    assert await store.checkpoints() == {"hook:a": 1}


async def test_a_refused_append_does_not_move_its_checkpoint(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    with pytest.raises(ConcurrencyError):
        await store.append("r1", 5, [phase("RUNNING")], checkpoint=Checkpoint("hook:a", 1))
    with pytest.raises(ConcurrencyError, match="no such stream"):
        await store.append("nope", None, [phase("RUNNING")], checkpoint=Checkpoint("hook:b", 1))
    assert await store.checkpoints() == {}
    assert await store.read_stream("nope") == []


async def test_concurrent_appends_in_one_batch_each_move_their_own_checkpoint(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    await store.append("r2", 0, [submitted()])
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: store.append("r1", None, [NewEvent("X")], checkpoint=Checkpoint("a", 1)))
        tg.start_soon(lambda: store.append("r2", None, [NewEvent("X")], checkpoint=Checkpoint("b", 2)))
        tg.start_soon(lambda: store.append("r1", None, [NewEvent("X")]))
    assert await store.checkpoints() == {"a": 1, "b": 2}
    assert [e.version for e in await store.read_stream("r1")] == [1, 2, 3]


async def test_checkpoints_only_move_forward(store: EventStore) -> None:
    await store.save_checkpoint(Checkpoint("a", 7))
    await store.save_checkpoint(Checkpoint("a", 3))
    assert await store.get_checkpoint("a") == 7
    await store.save_checkpoint(Checkpoint("a", 0))
    await store.save_checkpoint(Checkpoint("b", 0))
    assert await store.checkpoints() == {"a": 7, "b": 0}
    assert await store.last_seq() == 0  # a checkpoint is not an event


async def test_bad_checkpoints_are_refused(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    for bad in (Checkpoint("", 1), Checkpoint("a", -1), Checkpoint("a", True)):
        with pytest.raises(ValueError, match="checkpoint"):
            await store.save_checkpoint(bad)
        with pytest.raises(ValueError, match="checkpoint"):
            await store.append("r1", None, [NewEvent("X")], checkpoint=bad)
    assert await store.checkpoints() == {}
    assert await store.last_seq() == 1


async def test_checkpoints_survive_reopen_and_rebuild(db_path: Path) -> None:
    async with await EventStore.open(db_path) as store:
        await store.append("r1", 0, [submitted()])
        await store.save_checkpoint(Checkpoint("a", 1))
    async with await EventStore.open(db_path) as store:
        await store.rebuild()
        assert await store.checkpoints() == {"a": 1}


async def test_migration_adds_the_checkpoints_table_to_an_older_database(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    # A database as the jobsup before this step left it (schema 2, written by
    # that jobsup's own code: tests/store/fixtures/v2.db).
    assert MIGRATIONS.index(MIGRATION_CHECKPOINTS) == 2
    db_path.parent.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "fixtures" / "v2.db", db_path)
    conn = sqlite3.connect(db_path)
    assert "checkpoints" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    async with await EventStore.open(db_path) as new:
        await new.append("aaaa00000001", None, [NewEvent("X")], checkpoint=Checkpoint("a", 1))
        assert await new.checkpoints() == {"a": 1}


async def test_append_many_queues_appends_together_each_succeeding_or_failing_alone(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    await store.append("r2", 0, [submitted()])
    before = store.statistics().transactions
    results = await store.append_many(
        [
            Append("r1", None, [NewEvent("HookDelivered", {"n": 1})], Checkpoint("a", 1)),
            Append("nope", None, [NewEvent("HookDelivered", {"n": 2})], Checkpoint("b", 9)),  # no such run
            Append("r2", 1, [NewEvent("HookDelivered", {"n": 3})]),
            Append("r1", 5, [NewEvent("HookDelivered", {"n": 4})], Checkpoint("c", 9)),  # stale version
            Append("r1", None, [NewEvent("HookDelivered", {"n": 5})], Checkpoint("a", 2)),
        ]
    )
    assert isinstance(results[1], ConcurrencyError) and isinstance(results[3], ConcurrencyError)
    recorded = [r for r in results if isinstance(r, list)]
    assert [[(e.run_id, e.version, e.data["n"]) for e in r] for r in recorded] == [
        [("r1", 2, 1)],
        [("r2", 2, 3)],
        [("r1", 3, 5)],
    ]
    assert [e.seq for r in recorded for e in r] == [3, 4, 5]  # in the order given
    assert store.statistics().transactions == before + 1  # one transaction for all of them
    assert await store.checkpoints() == {"a": 2}  # only the recorded appends moved theirs
    assert await store.read_stream("nope") == []


async def test_append_many_refuses_bad_input_before_queueing_anything(store: EventStore) -> None:
    await store.append("r1", 0, [submitted()])
    with pytest.raises(ValueError, match="at least one event"):
        await store.append_many([Append("r1", None, [NewEvent("X")]), Append("r1", None, [])])
    with pytest.raises(ValueError, match="checkpoint"):
        await store.append_many([Append("r1", None, [NewEvent("X")], Checkpoint("", 1))])
    assert await store.last_seq() == 1
    assert await store.append_many([]) == []


async def test_append_many_on_a_closed_store_raises(db_path: Path) -> None:
    store = await EventStore.open(db_path)
    await store.append("r1", 0, [submitted()])
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.append_many([Append("r1", None, [NewEvent("X")])])
