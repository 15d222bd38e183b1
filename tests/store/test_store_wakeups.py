"""The cost side of wait_for_events (issue 29 item 6): waiters with a
timeout share one loop timer, a woken waiter leaves nothing behind, and the
in-memory re-check answers exactly what the database would."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import anyio
import pytest
from store_helpers import submitted

from store import EventStore, NewEvent, RecordedEvent
from store.subscriptions import Subscriptions

pytestmark = pytest.mark.anyio


def _live_timers() -> int:
    """Timers scheduled on the running loop and not cancelled."""
    loop: Any = asyncio.get_running_loop()
    return sum(1 for handle in loop._scheduled if not handle.cancelled())


async def test_waiters_with_a_timeout_share_one_loop_timer(store: EventStore) -> None:
    runs = [f"r{i}" for i in range(20)]
    for run_id in runs:
        await store.append(run_id, 0, [submitted()])
    head = await store.last_seq()
    before = _live_timers()
    got: list[list[RecordedEvent]] = []

    async def wait(run_id: str) -> None:
        got.append(await store.wait_for_events(head, run_ids=[run_id], timeout_s=30))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            for run_id in runs:
                tg.start_soon(wait, run_id)
        with anyio.fail_after(30):
            while store.statistics().waiters < 100:
                await anyio.sleep(0.01)
        # One timer for the earliest deadline (one loop.call_at per waiter before).
        assert _live_timers() - before <= 1
        for run_id in runs:
            await store.append(run_id, 1, [NewEvent("Tick")])
    assert len(got) == 100 and all(len(events) == 1 for events in got)
    # Every waiter woke by a commit: no deadline, no timer left.
    assert _live_timers() == before
    assert store.statistics().waiters == 0
    # A timeout still times out, and the timer goes with it.
    assert await store.wait_for_events(await store.last_seq(), run_ids=["r0"], timeout_s=0.05) == []
    assert _live_timers() == before


def _event(seq: int, run_id: str, type_: str) -> RecordedEvent:
    return RecordedEvent(seq, run_id, 1, type_, "2026-01-01T00:00:00Z", {})


@pytest.mark.parametrize("seed", range(20))
def test_the_in_memory_recheck_answers_what_the_log_holds(seed: int) -> None:
    """Random batches, windows, gaps and filters: whenever ``recent`` answers
    (not None), it is exactly the matching published events."""
    rng = random.Random(seed)
    subs = Subscriptions(0, max_recent_events=rng.choice([1, 3, 8, 30]), max_recent_lines=10_000)
    log: list[RecordedEvent] = []
    runs = [f"r{i}" for i in range(6)]
    seq = 0
    for _ in range(60):
        if rng.random() < 0.05:  # another process appended: in the log, never published here
            for _ in range(rng.randint(1, 3)):
                seq += 1
                log.append(_event(seq, rng.choice(runs), "Tick"))
        batch = []
        for _ in range(rng.randint(1, 5)):
            seq += 1
            batch.append(_event(seq, rng.choice(runs), rng.choice(["Tick", "PhaseChanged"])))
        log.extend(batch)
        subs.publish(batch)
        for _ in range(10):
            after = rng.randint(max(0, seq - 12), seq)
            run_ids = frozenset(rng.sample(runs, rng.randint(1, 3))) if rng.random() < 0.8 else None
            types = frozenset(["Tick"]) if rng.random() < 0.3 else None
            limit = rng.choice([1, 2, 1000])
            answer = subs.recent(after, run_ids, types, limit)
            if answer is None:
                continue
            expected = [
                e
                for e in log
                if e.seq > after and (run_ids is None or e.run_id in run_ids) and (types is None or e.type in types)
            ][:limit]
            assert answer == expected, (after, run_ids, types, limit)
