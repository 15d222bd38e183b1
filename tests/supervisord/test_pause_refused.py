"""`pause`/`resume` are refused, with one line and nothing recorded, for a
run of a backend that cannot pause (here a fake Kubernetes-like backend
over a real store and supervisor)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import EventStore
from supervisord.daemon.backends.base import Pausable, RunReporter, RunSpec
from supervisord.daemon.backends.local import LocalBackend
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.exceptions import UsageError
from supervisord.shared.paths import Paths

pytestmark = pytest.mark.anyio


class Remote:
    name = "kubernetes"

    async def preflight(self, spec: RunSpec) -> list[str]:
        return []

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
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


def test_only_the_local_backend_can_pause() -> None:
    assert isinstance(LocalBackend(), Pausable)
    assert not isinstance(Remote(), Pausable)


async def test_pause_of_a_kubernetes_run_is_refused(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "state", tmp_path / "s.sock")
    paths.runs_dir.mkdir(parents=True)
    async with await EventStore.open(paths.database) as store, anyio.create_task_group() as tg:
        sup = Supervisor(store, {"kubernetes": Remote()}, paths, tg)
        run = await sup.submit(
            {"project": "p", "name": "n", "backend": "kubernetes", "command": "true", "timeout_s": 60}
        )
        with anyio.fail_after(10):
            while (await sup.get(run.id)).phase != "RUNNING":
                await anyio.sleep(0.01)
        for action in (sup.pause, sup.resume):
            with pytest.raises(UsageError, match=r"is a kubernetes run: only local runs can be"):
                await action(run.id)
        types = [e.type for e in await store.read_stream(run.id)]
        assert "Paused" not in types and "Resumed" not in types
        tg.cancel_scope.cancel()
