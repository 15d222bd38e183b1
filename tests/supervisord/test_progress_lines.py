"""Progress from log lines (Kubernetes and other per-line backends): a line
``JOBSUP_PROGRESS <json>`` is a progress report, recorded at most once per
``local.progress_interval_s`` and once more, if it changed, just before the
run's terminal phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import PROGRESS, EventStore, NewEvent
from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.supervisor import _Reporter, _RunState

pytestmark = pytest.mark.anyio


async def test_progress_lines_are_rate_limited_and_the_last_one_recorded_at_the_end(tmp_path: Path) -> None:
    store = await EventStore.open(tmp_path / "jobsup.db")
    try:
        run_id = "0123456789ab"
        data = {"project": "p", "name": "n", "backend": "kubernetes"}
        await store.append(run_id, 0, [NewEvent("Submitted", data)])
        spec = RunSpec(
            run_id=run_id,
            project="p",
            name="n",
            backend="kubernetes",
            command="x",
            timeout_s=60,
            env={},
            config={"local": {"progress_interval_s": 3600}},
            snapshot=tmp_path / "snap.tar",
            snapshot_sha256="",
            commit="",
            repo="",
            run_dir=tmp_path / "run",
            submitted=data,
        )
        state = _RunState.queued(spec)
        state.version = 1
        reporter = _Reporter(store, state)
        for i in range(1, 201):
            lines = [(f"{i}a", "ordinary output"), (f"{i}b", f'JOBSUP_PROGRESS {{"step": {i}, "total": 200}}')]
            await reporter.log_lines("stdout", "pod/main", lines)
        await reporter.log_lines("stdout", "pod/main", [("x", "JOBSUP_PROGRESS {not json")])
        events = await store.read_all(0, limit=10_000, run_id=run_id, types=[PROGRESS])
        assert [e.data for e in events] == [{"step": 1, "total": 200}]  # one per hour at most
        await reporter.phase("RUNNING")
        await reporter.phase("COMPLETED")
        events = await store.read_all(0, limit=10_000, run_id=run_id)
        assert [e.type for e in events][-2:] == [PROGRESS, "PhaseChanged"]
        assert events[-2].data == {"step": 200, "total": 200}
        run = await store.get_run(run_id)
        assert run is not None and run.progress is not None and run.progress["step"] == 200
    finally:
        await store.close()
