"""W13: once the local runner has written its final status, a cancel
returns that outcome (phase, reason, exit code), however much of the run's
output is still to be recorded: the cancel reaches a run that has already
ended, so the run keeps its own word.

Deterministic: the run ends while no supervisor follows it (as during a
daemon restart); a second supervisor reattaches, and its first drain of the
output waits until the cancel is recorded."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from store import EventStore
from supervisord.daemon.backends.local import LocalBackend
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths
from tests.supervisord.backends.test_local_log_backlog import _submit_and_leave, _wait_exited

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.mark.parametrize(
    ("command", "timeout_s", "reason", "exit_code"),
    [
        ("echo out; exit 3", 600, "NonZeroExit", 3),
        ("echo out; sleep 60", 3, "DeadlineExceeded", None),
    ],
    ids=["nonzero-exit", "deadline"],
)
async def test_cancel_after_the_final_status_returns_the_runners_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, timeout_s: int, reason: str, exit_code: int | None
) -> None:
    go = tmp_path / "go"  # the job starts once the first supervisor has left
    run_id, run_dir = await _submit_and_leave(
        tmp_path, f"while [ ! -e {go} ]; do sleep 0.05; done; {command}", timeout_s=timeout_s
    )
    go.touch()
    status = await _wait_exited(run_dir)
    assert status["reason"] == reason

    cancel_recorded = anyio.Event()
    real_drain = LocalBackend._drain

    async def drain_after_the_cancel(*args: object, **kwargs: object) -> int:
        await cancel_recorded.wait()
        return await real_drain(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalBackend, "_drain", staticmethod(drain_after_the_cancel))
    paths = Paths(state_dir=tmp_path / "state", socket=tmp_path / "s.sock")
    store = await EventStore.open(paths.database)
    try:
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": LocalBackend(kill_grace_s=1)}, paths, tg)
            assert await sup.reattach_all() == 1
            result: list[object] = []

            async def cancel() -> None:
                result.append(await sup.cancel(run_id))

            tg.start_soon(cancel)
            with anyio.fail_after(60):
                while not any(e.type == "CancelRequested" for e in await store.read_stream(run_id)):
                    await anyio.sleep(0.02)
            cancel_recorded.set()
            with anyio.fail_after(60):
                while not result:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        canceled = result[0]
        run = await store.get_run(run_id)
        assert run is not None
        for r in (canceled, run):
            assert (r.phase, r.reason, r.exit_code) == ("ERROR", reason, exit_code)  # type: ignore[attr-defined]
        phases = [e.data["phase"] for e in await store.read_stream(run_id) if e.type == "PhaseChanged"]
        assert "CANCELED" not in phases
        assert (await store.log_text(run_id, 0, max_blocks=100))[1] == b"out\n"
    finally:
        await store.close()
