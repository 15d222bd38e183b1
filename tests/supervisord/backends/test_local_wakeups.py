"""Event-driven supervision of local runs (supervisord/daemon/backends/local/wakeups.py):
an idle run costs the daemon no polling; its output, status changes and the
runner's exit (even a kill -9) wake its loop at once; without inotify the
loop polls as before."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from supervisord.daemon.backends.local import LocalBackend, wakeups
from supervisord.daemon.backends.local import backend as local_backend
from supervisord.daemon.backends.local.wakeups import Wakeups
from tests.supervisord.backends.conformance import BackendHarness, SupervisorHarness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[SupervisorHarness]:
    harness = BackendHarness(name="local", make=lambda: LocalBackend(kill_grace_s=2))
    async for h in SupervisorHarness.open(tmp_path, harness):
        yield h


def _backend(h: SupervisorHarness) -> LocalBackend:
    backend = h.supervisor.backends["local"]
    assert isinstance(backend, LocalBackend)
    return backend


async def test_idle_runs_are_not_polled(h: SupervisorHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five idle runs read their status files ~never while idle (the polling
    loop read each one at least every second: >= 10 reads in 3 s)."""
    reads = 0
    original = local_backend._StatusFile.read

    def counting(self: local_backend._StatusFile) -> dict[str, object]:
        nonlocal reads
        reads += 1
        return original(self)

    monkeypatch.setattr(local_backend._StatusFile, "read", counting)
    ids = [await h.submit("echo up; sleep 120", name=f"idle{i}") for i in range(5)]
    for run_id in ids:
        await h.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines > 0)
    await anyio.sleep(1.0)  # the loops' last look after the line was recorded
    before = reads
    await anyio.sleep(3.0)
    assert reads - before <= 2, f"{reads - before} status reads in 3 s by 5 idle runs"
    for run_id in ids:
        await h.supervisor.cancel(run_id)


async def test_output_status_and_exit_wake_an_idle_run(h: SupervisorHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no safety sweep at all, a run that is idle for a while, then
    prints, then exits is still followed as it goes (each change wakes it)."""
    monkeypatch.setattr(local_backend, "SWEEP_S", 3600.0)
    run_id = await h.submit("sleep 2; echo late-line; sleep 2; exit 4")
    run = await h.wait_until(run_id, lambda r: r.log_lines > 0, timeout_s=60)
    assert run.phase == "RUNNING"
    run = await h.terminal(run_id, timeout_s=60)
    assert run.phase == "ERROR" and run.exit_code == 4, run
    assert await h.lines(run_id) == [("stdout", "late-line")]


async def test_runner_killed_wakes_the_loop(h: SupervisorHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of an idle run's runner: its pidfd wakes the loop (no sweep):
    the run is Lost and its job is killed."""
    monkeypatch.setattr(local_backend, "SWEEP_S", 3600.0)
    run_id = await h.submit("echo up; sleep 300")
    await h.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines > 0)
    run = await h.store.get_run(run_id)
    assert run is not None
    handle = run.handle
    await anyio.sleep(0.5)  # the loop is napping
    os.kill(int(handle["runner_pid"]), signal.SIGKILL)
    run = await h.terminal(run_id, timeout_s=60)
    assert run.phase == "ERROR" and run.reason == "Lost", run


async def test_without_inotify_runs_are_polled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No inotify instance to be had (the per-user limit): runs are polled
    as before, and still complete with their output."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(wakeups, "INotify", refuse)
    harness = BackendHarness(name="local", make=lambda: LocalBackend(kill_grace_s=2))
    async for h in SupervisorHarness.open(tmp_path, harness):
        run_id = await h.submit("sleep 1; echo polled")
        run = await h.terminal(run_id, timeout_s=60)
        assert run.phase == "COMPLETED", run
        assert await h.lines(run_id) == [("stdout", "polled")]
        assert not _backend(h)._wakeups.serving


async def test_dispatch(tmp_path: Path) -> None:
    """Events reach the run they name; an output event cuts only an idle
    nap; a queue overflow wakes every run; an event before the nap (after
    begin) makes it return at once."""
    service = Wakeups()
    status_dir, a_dir, b_dir = tmp_path / ".status", tmp_path / "a", tmp_path / "b"
    for d in (status_dir, a_dir, b_dir):
        d.mkdir()
    a = service.watch(a_dir, status_dir, None, None)
    b = service.watch(b_dir, status_dir, None, None)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.serve)
            await anyio.sleep(0.05)
            assert not a.event_driven  # no pidfd
            a.begin()
            b.begin()
            (status_dir / "a").write_bytes(b"x")
            with anyio.fail_after(30):
                await a.nap(3600, idle=True)
            with anyio.move_on_after(0.3):
                await b.nap(3600, idle=True)
                pytest.fail("b woken by a's status")
            # Output: a busy nap (idle=False) sleeps on; an idle one wakes.
            b.begin()
            (b_dir / "output.log").write_bytes(b"line\n")
            with anyio.move_on_after(0.3):
                await b.nap(3600, idle=False)
                pytest.fail("a busy nap woken by output")
            with anyio.fail_after(30):
                await b.nap(3600, idle=True)
            # Files that are not the run's are ignored.
            b.begin()
            (b_dir / "other.txt").write_bytes(b"x")
            with anyio.move_on_after(0.3):
                await b.nap(3600, idle=True)
                pytest.fail("woken by an unrelated file")
            tg.cancel_scope.cancel()
        a.begin()
        b.begin()
        service.dispatch([(-1, int(wakeups.flags.Q_OVERFLOW), 0, "")])
        with anyio.fail_after(5):
            await a.nap(3600, idle=False)
            await b.nap(3600, idle=False)
    finally:
        a.close()
        b.close()
        service.close()
