"""Hook outcomes racing the supervisor's own appends to the same runs.

A hook outcome (``HookDelivered`` / ``HookFailed``) is appended at the end of
the run's stream, whatever its version; the supervisor appends with the
version it last saw (optimistic concurrency). Every outcome that lands
between two supervisor appends makes the supervisor's version stale. It must
never lose an append to that: an outcome recorded in the same batch as the
supervisor's retry used to fail the retry (ConcurrencyError out of
supervision)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from store import EventStore, LogBlock, NewEvent
from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.hooks.delivery import HOOK_DELIVERED
from supervisord.daemon.supervisor import _Reporter, _RunState
from supervisord.shared.events import HELD

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@dataclasses.dataclass
class _Spec:
    run_id: str
    #: the run's Submitted data (the retry policy is read from it): none here
    submitted: dict[str, Any] = dataclasses.field(default_factory=dict)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EventStore]:
    s = await EventStore.open(tmp_path / "jobsup.db", synchronous="OFF", commit_window_s=0.002)
    try:
        yield s
    finally:
        await s.close()


async def test_supervisor_appends_survive_racing_hook_outcomes(store: EventStore) -> None:
    runs, rounds, hooks = 20, 25, 3
    reporters: dict[str, _Reporter] = {}
    for i in range(runs):
        run_id = f"cccc{i:08x}"
        await store.append(run_id, 0, [NewEvent("Submitted", {"project": "p", "name": "n", "backend": "local"})])
        status = await store.get_run(run_id)
        assert status is not None
        reporters[run_id] = _Reporter(store, _RunState(cast(RunSpec, _Spec(run_id)), status))

    async def supervise(run_id: str) -> None:
        reporter = reporters[run_id]
        await reporter.phase("RUNNING")
        for r in range(rounds):
            await reporter.log_lines("stdout", "stdout", [(str(r), f"line {r}")])
            await reporter.record(HELD({}))
            await reporter.log_block(LogBlock.from_pairs("stderr", "stderr", [(str(r + 1), f"err {r}")]))
        await reporter.phase("COMPLETED", exit_code=0)

    async def hook_outcomes(run_id: str, hook: int) -> None:
        # What HookRunner._append_outcome does: at the stream's end, any version.
        for r in range(rounds):
            data: dict[str, Any] = {
                "hook": f"h{hook}", "kind": "webhook", "event_seq": r, "phase": "RUNNING",
                "attempt": 1, "duration_s": 0.001, "status": 200,
            }  # fmt: skip
            await store.append(run_id, None, [NewEvent(HOOK_DELIVERED, data)])
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        for run_id in reporters:
            tg.start_soon(supervise, run_id)
            for h in range(hooks):
                tg.start_soon(hook_outcomes, run_id, h)

    for run_id in reporters:
        stream = await store.read_stream(run_id)
        types = [e.type for e in stream]
        assert types.count(HOOK_DELIVERED) == rounds * hooks
        assert types.count("LogLines") == 2 * rounds and types.count("Held") == rounds
        assert [e.data["phase"] for e in stream if e.type == "PhaseChanged"] == ["RUNNING", "COMPLETED"]
        assert [e.version for e in stream] == list(range(1, len(stream) + 1))
        status = await store.get_run(run_id)
        assert status is not None and status.phase == "COMPLETED"
