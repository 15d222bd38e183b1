"""A cancel that arrives while a local run's runner is being started stops
that runner once it is known: the run never goes on unsupervised after
being recorded CANCELED (its GPUs would be handed out under it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import EventStore
from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.backends.local import LocalBackend
from supervisord.daemon.runprocs import live_run_ids
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths
from supervisord.shared.source import SnapshotStore, resolve_commit
from tests.supervisord.jobsup_env import make_repo

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_cancel_during_the_start_stops_the_started_runner(tmp_path: Path) -> None:
    paths = Paths(state_dir=tmp_path / "state", socket=tmp_path / "s.sock")
    paths.runs_dir.mkdir(parents=True, exist_ok=True)
    commit = resolve_commit(make_repo(tmp_path / "repo", {"README": "x\n"}), "HEAD")
    snapshot = SnapshotStore(paths.state_dir / "snapshots").create(tmp_path / "repo", commit)
    marks = tmp_path / "marks"
    in_start, go = anyio.Event(), anyio.Event()

    class SlowStart(LocalBackend):
        async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
            in_start.set()
            await go.wait()
            return await super().start(spec, reporter)

    async with await EventStore.open(paths.database) as store:
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": SlowStart(kill_grace_s=1)}, paths, tg)
            submitted = {
                "project": "p", "name": "t", "backend": "local", "timeout_s": 600,
                "command": f"echo start >> {marks}; sleep 60; echo end >> {marks}",
                "source": {"repo": str(tmp_path / "repo"), "commit": commit, "snapshot_sha256": snapshot.sha256},
                "config": {},
            }  # fmt: skip
            run_id = (await sup.submit(submitted)).id
            with anyio.fail_after(30):
                await in_start.wait()
            result: list[Any] = []

            async def cancel() -> None:
                result.append(await sup.cancel(run_id))

            tg.start_soon(cancel)
            with anyio.fail_after(30):
                while not any(e.type == "CancelRequested" for e in await store.read_stream(run_id)):
                    await anyio.sleep(0.02)
            await anyio.sleep(0.3)  # the cancel has asked the backend, which knew no runner yet
            go.set()
            with anyio.fail_after(60):
                while not result:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        assert result[0].phase == "CANCELED"
        # Nothing of the run is left running.
        assert run_id not in await anyio.to_thread.run_sync(live_run_ids)
        assert not marks.exists() or "end" not in marks.read_text()
