"""What every event store must do, as reusable test cases (the layout of
pyeventsourcing's ``tests/persistence.py``): subclass :class:`StoreContract`
and give its ``store`` fixture; tests/store/test_store_contract.py runs the
cases against the real store and against the fault-injecting wrapper
(tests/store/faulty_store.py) with no fault set."""

from __future__ import annotations

import anyio
import pytest
from store_helpers import lines, phase, submitted

from store import (
    Append,
    Checkpoint,
    ConcurrencyError,
    EventStore,
    LogBlock,
    NewEvent,
)

__all__ = ["StoreContract"]


class StoreContract:
    """The cases. A subclass defines the ``store`` fixture (an open store on
    an empty database)."""

    pytestmark = pytest.mark.anyio

    async def test_append_then_read_in_order(self, store: EventStore) -> None:
        a = await store.append("aaaa00000001", 0, [submitted()])
        b = await store.append("bbbb00000002", 0, [submitted(name="eval")])
        c = await store.append("aaaa00000001", 1, [phase("SCHEDULING"), phase("RUNNING")])
        assert [(e.seq, e.version) for e in a + b + c] == [(1, 1), (2, 1), (3, 2), (4, 3)]
        assert await store.read_all(0) == a + b + c
        assert await store.read_all(2, limit=1) == c[:1]
        assert await store.read_all(0, run_id="bbbb00000002") == b
        assert await store.read_stream("aaaa00000001") == a + c
        assert await store.last_seq() == 4

    async def test_a_stale_version_writes_nothing(self, store: EventStore) -> None:
        await store.append("r1", 0, [submitted()])
        with pytest.raises(ConcurrencyError):
            await store.append("r1", 0, [phase("RUNNING")])
        assert await store.last_seq() == 1
        run = await store.get_run("r1")
        assert run is not None and run.version == 1 and run.phase == "QUEUED"

    async def test_each_append_of_a_batch_succeeds_or_fails_alone(self, store: EventStore) -> None:
        await store.append("r1", 0, [submitted()])
        done = await store.append_many(
            [
                Append("r2", 0, [submitted(name="b")]),
                Append("r1", 0, [phase("RUNNING")]),
                Append("r1", 1, [phase("RUNNING")]),
            ]
        )
        assert isinstance(done[1], ConcurrencyError)
        assert [e.run_id for r in (done[0], done[2]) for e in r] == ["r2", "r1"]  # type: ignore[union-attr]

    async def test_runs_are_projected(self, store: EventStore) -> None:
        await store.append("aaaa00000001", 0, [submitted(project="p", name="one")])
        await store.append("bbbb00000002", 0, [submitted(project="q", name="two")])
        await store.append("aaaa00000001", 1, [phase("RUNNING"), phase("COMPLETED", exit_code=0)])
        one = await store.get_run("aaaa00000001")
        assert one is not None and one.phase == "COMPLETED" and one.terminal and one.exit_code == 0
        assert [r.id for r in await store.list_runs()] == ["bbbb00000002", "aaaa00000001"]
        assert [r.id for r in await store.list_runs(project="q")] == ["bbbb00000002"]
        assert [r.id for r in await store.list_runs(non_terminal_only=True)] == ["bbbb00000002"]
        assert await store.match_run_ids("aaaa") == ["aaaa00000001"]
        assert set(await store.get_runs(["aaaa00000001", "zzzz"])) == {"aaaa00000001"}

    async def test_a_checkpoint_moves_with_its_events_and_never_back(self, store: EventStore) -> None:
        await store.append("r1", 0, [submitted()], checkpoint=Checkpoint("hook:a", 1))
        assert await store.get_checkpoint("hook:a") == 1
        await store.save_checkpoint(Checkpoint("hook:a", 0))
        assert await store.checkpoints() == {"hook:a": 1}
        assert await store.get_checkpoint("hook:none") is None

    async def test_a_waiter_wakes_on_a_commit(self, store: EventStore) -> None:
        await store.append("r1", 0, [submitted()])
        got: list[int] = []

        async def wait() -> None:
            got.extend(e.seq for e in await store.wait_for_events(1, run_ids=["r1"], timeout_s=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.05)
            await store.append("r2", 0, [submitted(name="other")])  # not for the waiter
            await store.append("r1", 1, [phase("RUNNING")])
        assert got == [3]
        assert await store.wait_for_events(3, timeout_s=0.01) == []

    async def test_log_lines_read_back_as_lines_and_text(self, store: EventStore) -> None:
        await store.append("r1", 0, [submitted()])
        await store.append_log("r1", None, [LogBlock("stdout", "stdout", b"one\ntwo\nthree\n", start=0)])
        assert [(ln.line_no, ln.text) for ln in await store.log_lines("r1")] == [(1, "one"), (2, "two"), (3, "three")]
        assert await store.log_text("r1", 1) == (3, b"two\nthree\n")
        assert await store.tail_line_no("r1", 1) == 2
        run = await store.get_run("r1")
        assert run is not None and run.log_lines == 3

    async def test_event_data_reads_back_as_json(self, store: EventStore) -> None:
        [event] = await store.append("r1", 0, [NewEvent("StagingStep", {"step": ("a", 1), "none": None})])
        assert event.data == {"step": ["a", 1], "none": None}
        assert lines  # the helpers stay importable for subclasses' own cases
