"""S5: the pending file (a queued run's env values, 0600) of a submit cut
off by a crash before its Submitted committed stayed on disk for good; the
daemon now removes, at start, every pending file no run waits on."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from store import EventStore, NewEvent
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths
from tests.supervisord.jobsup_env import JobsupEnv
from tests.supervisord.scheduler.test_driver import Recorder, _sub


def _pending(paths: Paths, run_id: str) -> Path:
    path = paths.runs_dir / run_id / "pending.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env": {"TOKEN": "s3cret"}, "config": {}}))
    return path


@pytest.mark.anyio
async def test_pending_files_no_run_waits_on_are_removed_at_start(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "state", tmp_path / "s.sock")
    paths.runs_dir.mkdir(parents=True)
    async with await EventStore.open(paths.database) as store:
        await store.append("aaaa00000001", 0, [_sub("queued")])
        await store.append(
            "bbbb00000002", 0, [_sub("ended"), NewEvent("PhaseChanged", {"phase": "CANCELED", "reason": "Canceled"})]
        )
        await store.append(
            "cccc00000003",
            0,
            [
                _sub("started"),
                NewEvent("Admitted", {"queue": "default", "gpus": []}),
                NewEvent("PhaseChanged", {"phase": "SCHEDULING", "reason": None, "message": "admitted"}),
                NewEvent("HandleRecorded", {"handle": {"fake": True}}),
                NewEvent("PhaseChanged", {"phase": "RUNNING", "reason": None, "message": None}),
            ],
        )
        queued = _pending(paths, "aaaa00000001")
        ended = _pending(paths, "bbbb00000002")
        started = _pending(paths, "cccc00000003")
        cut_off = _pending(paths, "dddd00000004")  # its Submitted never committed
        (paths.runs_dir / "eeee00000005").mkdir()  # another run's folder: not touched
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": Recorder()}, paths, tg)
            sup.gated = True
            await sup.reattach_all()
            removed = await sup.remove_orphan_pending()
            tg.cancel_scope.cancel()
    assert removed == ["bbbb00000002", "cccc00000003", "dddd00000004"]
    assert queued.exists()  # still to start: its env values are there only
    assert not ended.exists() and not started.exists() and not cut_off.exists()
    assert not cut_off.parent.exists()  # the cut-off submit's empty folder went too
    assert ended.parent.exists() and (paths.runs_dir / "eeee00000005").exists()


@pytest.mark.timeout(90)
def test_the_daemon_removes_a_cut_off_submits_pending_file_at_start(js: JobsupEnv) -> None:
    orphan = js.state_dir / "runs" / "ffff00000006" / "pending.json"
    orphan.parent.mkdir(parents=True)
    orphan.write_text(json.dumps({"env": {"TOKEN": "s3cret"}, "config": {}}))
    js.start_daemon()
    assert not orphan.exists() and not orphan.parent.exists()
