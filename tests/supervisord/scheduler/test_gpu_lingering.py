"""A GPU is never handed out while any process of a run that held it lives:
a run recorded as ended whose job left a process behind (one that carries
its ``JOBSUP_RUN_ID``) keeps its GPU, in the running daemon and after a
restart, until that process is gone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
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

A, B = "aaaa00000001", "bbbb00000002"


class EndsAtOnce:
    """A backend whose runs end COMPLETED as soon as they start (the one
    named ``ends``), or run until cancelled."""

    name = "local"

    def __init__(self, ends: str) -> None:
        self.ends = ends
        self.started: list[str] = []

    async def preflight(self, spec: RunSpec) -> list[str]:
        return []

    async def never_started(self, spec: RunSpec) -> bool:
        return spec.run_id not in self.started

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        self.started.append(spec.run_id)
        await reporter.handle({"fake": True})
        return {"fake": True}

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        await reporter.phase("RUNNING")
        if spec.run_id == self.ends:
            await reporter.phase("COMPLETED", final=True)
            return
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


@pytest.fixture
def leftover() -> Iterator[subprocess.Popen[bytes]]:
    """A process of run A's job that outlives it (it left the job's group)."""
    proc = subprocess.Popen(["sleep", "120"], env={**os.environ, "JOBSUP_RUN_ID": A})
    yield proc
    proc.kill()
    proc.wait()


async def _phase(store: EventStore, run_id: str) -> str:
    run = await store.get_run(run_id)
    assert run is not None
    return run.phase


async def test_an_ended_runs_gpu_stays_held_while_its_processes_live(
    tmp_path: Path, leftover: subprocess.Popen[bytes]
) -> None:
    paths = Paths(tmp_path / "state", tmp_path / "s.sock")
    paths.runs_dir.mkdir(parents=True)
    inventory = Inventory((Gpu(0, "GPU-0"),))
    async with await EventStore.open(paths.database) as store:
        await store.append(A, 0, [_sub("a")])
        backend = EndsAtOnce(ends=A)
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": backend}, paths, tg)
            sup.gated = True
            await sup.reattach_all()
            sched = Scheduler(store, sup, inventory, SchedulerSettings(caps={}))
            await sched.load()
            tg.start_soon(sched.run)
            with anyio.fail_after(30):
                while await _phase(store, A) != "COMPLETED":
                    await anyio.sleep(0.02)
            await store.append(B, 0, [_sub("b")])
            await sup.reattach_all()  # B: supervised as a queued run (as submit would)
            await anyio.sleep(1.5)  # several looks at A's processes
            assert await _phase(store, B) == "QUEUED"
            assert sched.view()["gpus"][0]["holder"]["id"] == A
            tg.cancel_scope.cancel()

        # A restart: A is recorded COMPLETED, its process still lives.
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": backend}, paths, tg)
            sup.gated = True
            await sup.reattach_all()
            sched = Scheduler(store, sup, inventory, SchedulerSettings(caps={}))
            await sched.load()
            tg.start_soon(sched.run)
            await anyio.sleep(1.0)
            assert await _phase(store, B) == "QUEUED"
            assert sched.view()["gpus"][0]["holder"]["id"] == A
            leftover.kill()
            leftover.wait()
            with anyio.fail_after(30):
                while await _phase(store, B) != "RUNNING":
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        assert backend.started == [A, B]
        freed = await store.read_all(0, run_id=A, types=["ResourcesFreed"])
        assert len(freed) == 1
