"""The scheduler driver over a real store and supervisor (a fake backend
that records what it is asked to start): state re-derived from the log."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import EventStore, NewEvent
from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.scheduler.driver import Scheduler, SchedulerSettings
from supervisord.daemon.scheduler.gpus import Inventory
from supervisord.daemon.scheduler.policy import Gpu
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths

pytestmark = pytest.mark.anyio


class Recorder:
    name = "local"

    def __init__(self) -> None:
        self.started: dict[str, dict[str, str]] = {}

    async def preflight(self, spec: RunSpec) -> list[str]:
        return []

    async def never_started(self, spec: RunSpec) -> bool:
        return spec.run_id not in self.started

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        self.started[spec.run_id] = dict(spec.env)
        await reporter.handle({"fake": True})
        return {"fake": True}

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        await reporter.phase("RUNNING")
        await anyio.sleep_forever()

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        return None

    async def serve(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _sub(name: str) -> NewEvent:
    return NewEvent(
        "Submitted",
        {
            "project": "p",
            "name": name,
            "backend": "local",
            "command": "true",
            "timeout_s": 60,
            "scheduling": {"gpus": 1, "queue": "default", "priority": 0, "after": [], "after_any": [], "hold": False},
        },
    )


async def test_restart_resumes_an_admitted_run_and_keeps_its_gpu(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "state", tmp_path / "s.sock")
    paths.runs_dir.mkdir(parents=True)
    gpu1 = {"index": 1, "uuid": "GPU-1", "name": "", "memory": ""}
    async with await EventStore.open(paths.database) as store:
        # Run a: admitted on GPU 1, then the daemon died before starting it.
        await store.append(
            "aaaa00000001",
            0,
            [
                _sub("a"),
                NewEvent("Admitted", {"queue": "default", "gpus": [gpu1]}),
                NewEvent("PhaseChanged", {"phase": "SCHEDULING", "reason": None, "message": "admitted"}),
            ],
        )
        (paths.runs_dir / "aaaa00000001").mkdir()
        (paths.runs_dir / "aaaa00000001" / "pending.json").write_text(json.dumps({"env": {"X": "1"}, "config": {}}))
        # Runs b and c: queued (c held).
        await store.append("bbbb00000002", 0, [_sub("b")])
        await store.append("cccc00000003", 0, [_sub("c"), NewEvent("Held", {})])
        backend = Recorder()
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": backend}, paths, tg)
            sup.gated = True
            await sup.reattach_all()
            sched = Scheduler(store, sup, Inventory((Gpu(0, "GPU-0"), Gpu(1, "GPU-1"))), SchedulerSettings(caps={}))
            await sched.load()
            tg.start_soon(sched.run)
            with anyio.fail_after(30):
                while len(backend.started) < 2:
                    await anyio.sleep(0.02)
            view = sched.view()
            tg.cancel_scope.cancel()
        assert backend.started["aaaa00000001"]["CUDA_VISIBLE_DEVICES"] == "GPU-1"
        assert backend.started["aaaa00000001"]["X"] == "1"  # env kept through the restart
        assert backend.started["bbbb00000002"]["CUDA_VISIBLE_DEVICES"] == "GPU-0"
        assert "cccc00000003" not in backend.started
        admitted_a = await store.read_all(0, run_id="aaaa00000001", types=["Admitted"])
        assert len(admitted_a) == 1  # not admitted a second time
        assert [w["id"] for w in view["waiting"]] == ["cccc00000003"] and view["waiting"][0]["reason"] == "Held"
        assert not (paths.runs_dir / "aaaa00000001" / "pending.json").exists()
