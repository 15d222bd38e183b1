"""The store contract (tests/store/store_contract.py) on the real store and
on the fault-injecting wrapper; and what the wrapper's faults do: an append
that fails records nothing, and the store works on afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from faulty_store import FaultyStore
from store_contract import StoreContract
from store_helpers import phase, submitted

from store import EventStore, StorageFullError, StoreLockedError


class TestRealStore(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[EventStore]:
        async with await EventStore.open(tmp_path / "jobsup.db") as real:
            yield real


class TestFaultyStoreWithoutFaults(StoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[EventStore]:
        async with await EventStore.open(tmp_path / "jobsup.db") as real:
            yield cast(EventStore, FaultyStore(real))


pytestmark = pytest.mark.anyio


async def test_a_failed_append_records_nothing_and_the_next_one_works(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "jobsup.db") as real:
        faulty = FaultyStore(real)
        store = cast(EventStore, faulty)
        await store.append("r1", 0, [submitted()])
        faulty.fail("append", StorageFullError("database or disk is full"))
        with pytest.raises(StorageFullError):
            await store.append("r1", 1, [phase("RUNNING")])
        assert await store.last_seq() == 1
        assert [e.version for e in await store.append("r1", 1, [phase("RUNNING")])] == [2]
        assert faulty.calls["append"] == 3


async def test_a_failing_read_fails_alone(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "jobsup.db") as real:
        faulty = FaultyStore(real)
        store = cast(EventStore, faulty)
        await store.append("r1", 0, [submitted()])
        faulty.fail("read_all", StoreLockedError("database is locked"), times=2)
        for _ in range(2):
            with pytest.raises(StoreLockedError):
                await store.read_all(0)
        assert [e.seq for e in await store.read_all(0)] == [1]
        with pytest.raises(AttributeError):
            faulty.fail("no_such_method", StoreLockedError("x"))


#: The public methods EventStore had as one class (before its split by role):
#: the store's users call them by these names.
PUBLIC_METHODS = [
    "append",
    "append_log",
    "append_many",
    "archive_logs",
    "archive_path",
    "check_archive_before_delete",
    "check_log_text",
    "checkpoints",
    "clean_archive_dir",
    "close",
    "database_pages",
    "delete_archived_logs",
    "event_times",
    "first_events",
    "get_checkpoint",
    "get_run",
    "get_runs",
    "last_log_position",
    "last_seq",
    "list_runs",
    "log_archive",
    "log_archives",
    "log_lines",
    "log_text",
    "log_text_bytes",
    "match_run_ids",
    "open",
    "page_runs",
    "published_seq",
    "read_all",
    "read_stream",
    "rebuild",
    "save_checkpoint",
    "statistics",
    "storage_incidents",
    "storage_problem",
    "subscribe",
    "tail_line_no",
    "vacuum_step",
    "wait_for_events",
]


def test_the_facade_keeps_every_method_name_of_the_store() -> None:
    import inspect

    missing = [n for n in PUBLIC_METHODS if not hasattr(EventStore, n)]  # published_seq: a property
    assert missing == []
    roles = {c.__module__ for c in inspect.getmro(EventStore)} - {"builtins", "store.eventstore"}
    assert roles == {
        "store.eventlog",
        "store.runqueries",
        "store.logreading",
        "store.archiving",
        "store.maintenance",
        "store._core",
    }
