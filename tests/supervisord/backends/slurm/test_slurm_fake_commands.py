"""The Slurm backend against fake Slurm commands (scripts first on PATH):
what a real cluster cannot be made to do on demand. Runs without a cluster.

- a job that is in no record (squeue, sacct, scontrol) is Lost only after
  ``lost_after_s``;
- while squeue fails (slurmctld away), nothing is decided, however long.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.backends.slurm import SlurmBackend
from tests.supervisord.backends.conformance import BackendHarness, SupervisorHarness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SBATCH = "#!/bin/sh\necho 4242\n"
EMPTY = "#!/bin/sh\nexit 0\n"
DOWN = "#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"sbatch": SBATCH, "squeue": EMPTY, "sacct": EMPTY, "scontrol": EMPTY, "scancel": EMPTY}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield bin_dir


async def test_missing_everywhere_is_lost_after_lost_after_s(fake_bin: Path, tmp_path: Path) -> None:
    h = BackendHarness(
        name="slurm",
        make=lambda: SlurmBackend(poll_s=0.1, lost_after_s=1.5),
        config={"slurm": {"remote_dir": str(tmp_path / "remote")}},
        stderr_stream="stdout",
    )
    async for sh in SupervisorHarness.open(tmp_path, h):
        t0 = anyio.current_time()
        run_id = await sh.submit("true")
        run = await sh.terminal(run_id, timeout_s=30)
        assert run.phase == "ERROR" and run.reason == "Lost", run
        assert "4242" in (run.message or "")
        assert anyio.current_time() - t0 >= 1.5


async def test_squeue_failing_decides_nothing(fake_bin: Path, tmp_path: Path) -> None:
    (fake_bin / "squeue").write_text(DOWN)
    h = BackendHarness(
        name="slurm",
        make=lambda: SlurmBackend(poll_s=0.1, lost_after_s=0.5),
        config={"slurm": {"remote_dir": str(tmp_path / "remote")}},
        stderr_stream="stdout",
    )
    async for sh in SupervisorHarness.open(tmp_path, h):
        run_id = await sh.submit("true")
        await sh.wait_until(run_id, lambda r: r.handle is not None)
        await anyio.sleep(3)  # six times lost_after_s
        run = await sh.store.get_run(run_id)
        assert run is not None and not run.terminal, run
        # slurmctld is back and the job's record says it completed.
        (fake_bin / "squeue").write_text("#!/bin/sh\necho '4242|COMPLETED|None|0:03'\n")
        (fake_bin / "scontrol").write_text("#!/bin/sh\necho 'JobId=4242 JobState=COMPLETED ExitCode=0:0'\n")
        run = await sh.terminal(run_id, timeout_s=30)
        assert run.phase == "COMPLETED", run


async def test_never_started_looks_for_the_job_by_name_and_comment(fake_bin: Path, tmp_path: Path) -> None:
    spec = RunSpec(
        run_id="0123456789ab", project="p", name="n", backend="slurm", command="true", timeout_s=60, env={},
        config={}, snapshot=tmp_path / "s.tar", snapshot_sha256="x", commit="c", repo=str(tmp_path),
        run_dir=tmp_path, submitted={},
    )  # fmt: skip
    backend = SlurmBackend()
    try:
        assert await backend.never_started(spec)
        (fake_bin / "squeue").write_text("#!/bin/sh\necho '77|jobsup:ffffffffffff'\necho '78|jobsup:0123456789ab'\n")
        assert not await backend.never_started(spec)
        (fake_bin / "squeue").write_text(DOWN)
        assert not await backend.never_started(spec)  # cannot tell: supervise looks again
    finally:
        await backend.aclose()
