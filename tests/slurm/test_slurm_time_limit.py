"""Slurm's own time limit on the real cluster (its own file: about 70 s, so
xdist runs it beside the other Slurm tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slurm.slurm_env import SlurmCluster, supervised, texts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_slurm_time_limit_is_deadline_exceeded(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Slurm's own TIMEOUT (jobsup's exact deadline off): about 70 s."""
    make = lambda: slurm.backend(enforce_deadline=False)  # noqa: E731
    async with supervised(tmp_path, make, slurm.config("local", tmp_path)) as h:
        run_id = await h.submit("echo start; sleep 600", timeout_s=60)
        run = await h.terminal(run_id, timeout_s=200)
        assert run.phase == "ERROR" and run.reason == "DeadlineExceeded", run
        assert "TIMEOUT" in (run.message or ""), run
        assert any("DUE TO TIME LIMIT" in t for t in texts(await h.lines(run_id)))
