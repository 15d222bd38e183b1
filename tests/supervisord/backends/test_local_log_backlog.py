"""A run's outcome does not wait for its output backlog.

The backlog is made deterministic by supervising from a second supervisor
started after the job ended (as after a daemon restart): at its first look
the whole output is unread. ``_EXIT_DRAIN_S`` is set to 0 so any backlog
takes the "outcome first, backlog after" path.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

import supervisord.daemon.backends.local.backend as local_backend
from store import EventStore
from supervisord.daemon.backends.local import LocalBackend
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths
from supervisord.shared.source import SnapshotStore, resolve_commit
from tests.supervisord.jobsup_env import make_repo

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

N = 200_000
EMIT = f'python3 -c \'import sys; sys.stdout.write("".join("line %07d\\n" % i for i in range({N})))\''


async def _submit_and_leave(root: Path, command: str, timeout_s: int) -> tuple[str, Path]:
    """Submit ``command`` and stop supervising (as a daemon that is killed); return the run id and its folder."""
    paths = Paths(state_dir=root / "state", socket=root / "s.sock")
    paths.runs_dir.mkdir(parents=True, exist_ok=True)
    commit = resolve_commit(make_repo(root / "repo", {"README": "x\n"}), "HEAD")
    snapshot = SnapshotStore(paths.state_dir / "snapshots").create(root / "repo", commit)
    async with await EventStore.open(paths.database) as store:
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": LocalBackend(kill_grace_s=1)}, paths, tg)
            submitted = {
                "project": "p", "name": "t", "backend": "local", "command": command, "timeout_s": timeout_s,
                "source": {"repo": str(root / "repo"), "commit": commit, "snapshot_sha256": snapshot.sha256},
                "config": {},
            }  # fmt: skip
            run_id = (await sup.submit(submitted)).id
            with anyio.fail_after(60):
                while (run := await store.get_run(run_id)) and run.phase != "RUNNING":
                    await store.wait_for_events(run.last_seq, run_ids=[run_id], timeout_s=5)
            tg.cancel_scope.cancel()
    return run_id, paths.runs_dir / run_id


async def _wait_exited(run_dir: Path) -> dict[str, object]:
    with anyio.fail_after(120):
        while True:
            try:
                raw = local_backend._status_path(run_dir).read_bytes()
            except FileNotFoundError:
                raw = b""
            # The runner's status (signed since the durability work; the JSON is its first line).
            try:
                status = json.loads(raw.partition(b"\n")[0] or b"{}")
            except ValueError:
                status = {}
            if status.get("state") == "exited":
                return status
            await anyio.sleep(0.1)


async def test_outcome_is_recorded_before_the_backlog_and_cancel_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_backend, "_EXIT_DRAIN_S", 0.0)
    # Prints N lines once the first supervisor has left (on a loaded machine it
    # could otherwise record them all before it is stopped, leaving no
    # backlog), then sleeps past its 20 s timeout: the runner records
    # DeadlineExceeded.
    go = tmp_path / "go"
    wait_go = f"while [ ! -e {go} ]; do sleep 0.05; done"
    run_id, run_dir = await _submit_and_leave(tmp_path, f"{wait_go}; {EMIT}; sleep 60", timeout_s=20)
    go.touch()
    status = await _wait_exited(run_dir)
    assert status["reason"] == "DeadlineExceeded"

    paths = Paths(state_dir=tmp_path / "state", socket=tmp_path / "s.sock")
    store = await EventStore.open(paths.database)
    try:
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": LocalBackend(kill_grace_s=1)}, paths, tg)
            assert await sup.reattach_all() == 1
            with anyio.fail_after(120):
                while not (run := await store.get_run(run_id)) or not run.terminal:
                    await store.wait_for_events(run.last_seq if run else 0, run_ids=[run_id], timeout_s=5)
            # A cancel now (the backlog may still be going in) returns the run's own outcome.
            canceled = await sup.cancel(run_id)
            assert (canceled.phase, canceled.reason) == ("ERROR", "DeadlineExceeded")
            with anyio.fail_after(120):
                while (run := await store.get_run(run_id)) and run.log_ingest != "done":
                    await store.wait_for_events(run.last_seq, run_ids=[run_id], timeout_s=5)
            tg.cancel_scope.cancel()
        events = await store.read_stream(run_id)
        types = [e.type for e in events]
        pending = types.index("LogIngestPending")
        terminal = next(i for i, e in enumerate(events) if e.type == "PhaseChanged" and e.data["phase"] == "ERROR")
        assert pending < terminal < types.index("LogIngestDone")
        # The backlog's lines are recorded after the outcome, and all of them, once.
        assert any(e.type == "LogLines" and e.data["line_count"] for e in events[terminal:])
        assert "CANCELED" not in {e.data.get("phase") for e in events if e.type == "PhaseChanged"}
        last, text = await store.log_text(run_id, 0, max_blocks=10**6)
        assert text == "".join(f"line {i:07d}\n" for i in range(N)).encode()
        run = await store.get_run(run_id)
        assert run is not None and (run.phase, run.reason, run.log_lines, run.log_ingest) == (
            "ERROR",
            "DeadlineExceeded",
            N,
            "done",
        )
    finally:
        await store.close()


async def test_a_restart_during_a_pending_backlog_resumes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_backend, "_EXIT_DRAIN_S", 0.0)
    go = tmp_path / "go"  # the output starts once the first supervisor has left
    wait_go = f"while [ ! -e {go} ]; do sleep 0.05; done"
    run_id, run_dir = await _submit_and_leave(tmp_path, f"{wait_go}; {EMIT}; exit 3", timeout_s=600)
    go.touch()
    await _wait_exited(run_dir)
    paths = Paths(state_dir=tmp_path / "state", socket=tmp_path / "s.sock")
    store = await EventStore.open(paths.database)
    try:
        # A daemon that dies right after recording the outcome, before the backlog.
        real_drain = LocalBackend._drain
        calls = []

        async def stuck_after_outcome(*args: object, **kwargs: object) -> int:
            calls.append(1)
            if len(calls) > 1:  # _finish's second drain, after the outcome: hang as a daemon being killed
                await anyio.sleep_forever()
            return await real_drain(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(LocalBackend, "_drain", staticmethod(stuck_after_outcome))
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": LocalBackend(kill_grace_s=1)}, paths, tg)
            await sup.reattach_all()
            with anyio.fail_after(120):
                while not (run := await store.get_run(run_id)) or not run.terminal:
                    await store.wait_for_events(run.last_seq if run else 0, run_ids=[run_id], timeout_s=5)
            tg.cancel_scope.cancel()
        run = await store.get_run(run_id)
        assert run is not None and run.terminal and run.log_ingest == "pending"
        monkeypatch.setattr(LocalBackend, "_drain", staticmethod(real_drain))
        # The next daemon resumes the terminal run's backlog.
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": LocalBackend(kill_grace_s=1)}, paths, tg)
            assert await sup.reattach_all() == 1
            with anyio.fail_after(120):
                while (run := await store.get_run(run_id)) and run.log_ingest != "done":
                    await store.wait_for_events(run.last_seq, run_ids=[run_id], timeout_s=5)
            tg.cancel_scope.cancel()
        run = await store.get_run(run_id)
        assert run is not None and (run.phase, run.exit_code, run.log_lines) == ("ERROR", 3, N)
        last, text = await store.log_text(run_id, 0, max_blocks=10**6)
        assert text == "".join(f"line {i:07d}\n" for i in range(N)).encode()
    finally:
        await store.close()
