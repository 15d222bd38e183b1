"""The read side over a real store: queries, the wait and events streams."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from store import EventStore, NewEvent
from supervisord.daemon.readside import ReadSide
from supervisord.shared.exceptions import RunNotFoundError, UsageError

pytestmark = pytest.mark.anyio


def _submitted(name: str) -> NewEvent:
    return NewEvent("Submitted", {"project": "p", "name": name, "backend": "local"})


def _phase(phase: str) -> NewEvent:
    return NewEvent("PhaseChanged", {"phase": phase})


async def test_list_runs_in_flight_and_recent(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "j.db") as store:
        await store.append("ffff00000000", 0, [_submitted("old-but-running")])
        for i in range(25):
            await store.append(f"abcd{i:08x}", 0, [_submitted(f"n{i}"), _phase("COMPLETED")])
        reads = ReadSide(store)
        default = await reads.list_runs()
        assert len(default) == 21 and "ffff00000000" in {r.id for r in default}
        assert len(await reads.list_runs(all=True)) == 26
        assert [r.id for r in await reads.list_runs(phase="queued")] == ["ffff00000000"]
        with pytest.raises(UsageError, match="--phase"):
            await reads.list_runs(phase="DONE")


async def test_wait_stream(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "j.db") as store:
        await store.append("abcd00000001", 0, [_submitted("a")])
        reads = ReadSide(store)
        with pytest.raises(UsageError, match="--for"):
            await reads.open_wait(["abcd"], cond="soon")
        with pytest.raises(RunNotFoundError):
            await reads.open_wait(["ffff"])
        items = []
        stream = await reads.open_wait(["abcd"], cond="RUNNING", timeout=30)

        async def finish() -> None:
            await anyio.sleep(0.2)
            await store.append("abcd00000001", 1, [_phase("RUNNING")])

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish)
            async for item in stream:
                items.append(item)
        assert "after" in items[0]
        result = items[-1]["result"]
        assert result["met"] and not result["timed_out"] and result["runs"][0]["phase"] == "RUNNING"
        timed_out = [i async for i in await reads.open_wait(["abcd"], cond="terminal", timeout=0.1)]
        assert timed_out[-1]["result"]["timed_out"] is True


async def test_events_pages(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "j.db") as store:
        await store.append("abcd00000001", 0, [_submitted("a"), _phase("RUNNING"), _phase("COMPLETED")])
        reads = ReadSide(store)
        pages = [p async for p in reads.events(limit=2)]
        assert [len(p) for p in pages] == [2, 1]
        assert [e["seq"] for p in pages for e in p] == [1, 2, 3]
        assert [e["version"] for p in [p async for p in reads.events(after=2)] for e in p] == [3]
