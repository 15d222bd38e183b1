"""The daemon's background retention pass (``retention.archive_logs_after``)
archives runs that ended longer ago, and only those, while appends go on."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from store import EventStore, LogBlock, NewEvent
from supervisord.daemon import retention as retention_mod
from supervisord.daemon.retention import Retention, RetentionSettings
from supervisord.shared.paths import Paths

pytestmark = pytest.mark.anyio


async def _run(store: EventStore, run_id: str, *, end: bool) -> None:
    [sub] = await store.append(run_id, 0, [NewEvent("Submitted", {"project": "p", "name": run_id, "backend": "local"})])
    text = b"".join(b"line %d\n" % i for i in range(20_000))
    [ev] = await store.append_log(run_id, sub.version, [LogBlock("stdout", "stdout", text, start=0)])
    events = [NewEvent("PhaseChanged", {"phase": "RUNNING"})]
    if end:
        events.append(NewEvent("PhaseChanged", {"phase": "COMPLETED", "exit_code": 0}))
    await store.append(run_id, ev.version, events)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_background_pass_archives_ended_runs_while_appends_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    monkeypatch.setattr(retention_mod, "FIRST_PASS_S", 0.0)
    paths = Paths(state_dir=tmp_path / "state", socket=tmp_path / "s.sock")
    async with await EventStore.open(paths.database) as store:
        await _run(store, "ended0000001", end=True)
        await _run(store, "running00001", end=False)
        await anyio.sleep(1.1)
        settings = RetentionSettings(archive_logs_after_s=1)
        assert RetentionSettings.from_config({"retention": {"archive_logs_after": "1s"}}) == settings
        appended = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(Retention(store, paths, settings).run)
            with anyio.fail_after(60):
                while await store.log_archive("ended0000001") is None:
                    await store.append("other0000001", appended, [NewEvent("Tick", {"n": appended})])
                    appended += 1
            tg.cancel_scope.cancel()
        assert await store.log_archive("running00001") is None  # not terminal: never archived
        assert (paths.state_dir / "archive" / "ended0000001.jslog").is_file()
        lines = await store.log_lines("ended0000001", 19_990)
        assert [ln.text for ln in lines] == [f"line {i}" for i in range(19_990, 20_000)]
        assert appended >= 1
