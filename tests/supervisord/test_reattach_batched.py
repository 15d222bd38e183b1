"""Reattach reads every live run's facts in a few queries, not a few per
run: the Submitted events, the ``jobsup update`` changes (RunUpdated) and
where each run's output was last recorded (500 runs took seconds of
one-by-one reads before they were supervised again; bench/local_reattach.py).
The answers are the same as the per-run reads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import EventStore, NewEvent
from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths
from tests.supervisord.scheduler.test_driver import Recorder, _sub

pytestmark = pytest.mark.anyio

SOURCES = ("stdout", "stderr")


class PositionRecorder(Recorder):
    """Supervision that asks where each source resumes, twice (the second
    answer comes from the store), and keeps the answers."""

    def __init__(self, want: int) -> None:
        super().__init__()
        self.positions: dict[str, list[str | None]] = {}
        self.specs: dict[str, RunSpec] = {}
        self.want = want
        self.all_asked = anyio.Event()

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        self.specs[spec.run_id] = spec
        self.positions[spec.run_id] = [await reporter.log_position(s) for s in (*SOURCES, *SOURCES)]
        if len(self.positions) == self.want:
            self.all_asked.set()
        await anyio.sleep_forever()


def _running(run_id: str, lines: int) -> list[NewEvent]:
    events = [
        _sub(f"r{run_id}"),
        NewEvent("Admitted", {"queue": "default", "gpus": []}),
        NewEvent("PhaseChanged", {"phase": "SCHEDULING", "reason": None, "message": "admitted"}),
        NewEvent("HandleRecorded", {"handle": {"fake": True}}),
        NewEvent("PhaseChanged", {"phase": "RUNNING", "reason": None, "message": None}),
    ]
    if lines:
        events.append(
            NewEvent(
                "LogLines",
                {"stream": "stdout", "source": "stdout", "lines": [[str(100 * i), f"line {i}"] for i in range(lines)]},
            )
        )
    return events


async def test_reattach_reads_do_not_grow_with_the_runs(tmp_path: Path) -> None:
    counts = {}
    for n in (5, 40):
        paths = Paths(tmp_path / f"state{n}", tmp_path / f"s{n}.sock")
        paths.runs_dir.mkdir(parents=True)
        async with await EventStore.open(paths.database) as store:
            ids = [f"{i:012x}" for i in range(1, n + 1)]
            for k, run_id in enumerate(ids):
                await store.append(run_id, 0, _running(run_id, k % 3))
            # `jobsup update` while it was queued, on one run.
            await store.append(
                ids[0], None, [NewEvent("RunUpdated", {"old": {"timeout_s": 60}, "new": {"timeout_s": 123}})]
            )
            expected = {i: [await store.last_log_position(i, s) for s in SOURCES] for i in ids}
            backend = PositionRecorder(n)
            async with anyio.create_task_group() as tg:
                sup = Supervisor(store, {"local": backend}, paths, tg)
                sup.gated = True
                before = store.statistics().reads
                assert await sup.reattach_all() == n
                counts[n] = store.statistics().reads - before
                with anyio.fail_after(30):
                    await backend.all_asked.wait()
                tg.cancel_scope.cancel()
        # The prefetched answers are the store's, and later asks go to the store.
        assert {i: p[:2] for i, p in backend.positions.items()} == expected
        assert {i: p[2:] for i, p in backend.positions.items()} == expected
        assert any(p[0] is not None for p in expected.values())
        assert backend.specs[ids[0]].timeout_s == 123, backend.specs[ids[0]]
    assert counts[40] == counts[5], counts
