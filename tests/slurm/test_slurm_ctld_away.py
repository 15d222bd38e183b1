"""slurmctld away for 30 s on a private cluster (its own file: about 60 s)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.slurm.slurm_env import CLUSTER_SH, SlurmCluster, supervised, texts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_cluster(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """A second cluster of its own (about 2 s to start), so stopping its
    slurmctld disturbs no other test. Not under pytest's 0700 temp folder:
    sshd reads the keys as the test user."""
    where = Path(tempfile.mkdtemp(prefix="jobsup-private-slurm-"))
    env = {
        **os.environ,
        "JOBSUP_SLURM_CTLD_PORT": str(_free_port()),
        "JOBSUP_SLURM_SLURMD_PORT": str(_free_port()),
        "JOBSUP_SLURM_SSH_PORT": str(_free_port()),
    }
    try:
        subprocess.run([str(CLUSTER_SH), "up", str(where)], check=True, env=env, timeout=120, capture_output=True)
        yield SlurmCluster(where)
    finally:
        subprocess.run([str(CLUSTER_SH), "down", str(where)], check=False, timeout=120)
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.slow
async def test_slurmctld_away_30s_is_no_outcome(private_cluster: SlurmCluster, tmp_path: Path) -> None:
    """With slurmctld stopped for 30 s (longer than lost_after_s here) the
    run records no terminal phase; it completes once slurmctld is back."""
    c = private_cluster
    make = lambda: c.backend(lost_after_s=10)  # noqa: E731
    async with supervised(tmp_path, make, c.config("ssh", tmp_path)) as h:
        run_id = await h.submit("echo before; sleep 40; echo after")
        await h.wait_until(run_id, lambda r: r.phase == "RUNNING")
        await anyio.to_thread.run_sync(c.sh, "ctld-stop")
        await anyio.sleep(30)
        run = await h.store.get_run(run_id)
        assert run is not None and run.phase == "RUNNING", run
        await anyio.to_thread.run_sync(c.sh, "ctld-start")
        run = await h.terminal(run_id, timeout_s=120)
        assert run.phase == "COMPLETED", run
        assert texts(await h.lines(run_id)) == ["before", "after"]
