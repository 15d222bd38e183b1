"""A requeued Slurm job, and a job that is in no record (``Lost``), on the
real one-node Slurm (tests/slurm/cluster.sh): a supervisor over a real
store drives a real SlurmBackend."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.backends.slurm import SlurmBackend
from tests.slurm.slurm_env import SSH_HOST, SlurmCluster, supervised, texts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240), pytest.mark.slow]


async def test_requeued_job_reads_its_env_file_again(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``scontrol requeue`` runs the batch script again from the start: the
    env file is still there for it (0600), and gone once the job ended."""
    cmd = 'echo "tok=$TOKEN n=${SLURM_RESTART_COUNT:-0}"; [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 300'
    async with supervised(tmp_path, slurm.backend, slurm.config("local", tmp_path)) as h:
        run_id = await h.submit(cmd, env={"TOKEN": "s3cr3t-v"})
        run = await h.wait_until(run_id, lambda r: r.phase == "RUNNING")
        assert run.handle is not None
        job, run_dir = str(run.handle["job_id"]), str(run.handle["run_dir"])
        with anyio.fail_after(60):
            while "tok=s3cr3t-v n=0" not in texts(await h.lines(run_id)):
                await anyio.sleep(0.2)
        slurm.slurm("scontrol", "requeue", job)
        with anyio.fail_after(60):
            while slurm.slurm("squeue", "-h", "-j", job, "-o", "%T").strip() != "PENDING":
                await anyio.sleep(0.2)
        assert os.stat(f"{run_dir}/env.sh").st_mode & 0o777 == 0o600
        # A requeued job is eligible again only after ~2 minutes: in 5 s
        # (not at once: slurmd refuses a launch in the second of the
        # revoked credential of the killed one, "Job credential revoked").
        slurm.slurm("scontrol", "update", f"JobId={job}", "StartTime=now+5")
        run = await h.terminal(run_id)
        assert run.phase == "COMPLETED", run
        lines = texts(await h.lines(run_id))
        assert lines[0] == "tok=s3cr3t-v n=0" and lines[-1] == "tok=s3cr3t-v n=1", lines
        assert not os.path.exists(f"{run_dir}/env.sh")


class _VanishedJob(SlurmBackend):
    """Records a job id no Slurm source knows (as after a controller that
    lost its state): the rest, the polls and lookups, is the real backend's."""

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        run_dir = spec.run_dir / "gone"
        run_dir.mkdir(parents=True)
        handle = {"job_id": "987654321", "host": None, "run_dir": str(run_dir), "remote_dir": str(spec.run_dir)}
        await reporter.handle(handle)
        return handle


async def test_job_in_no_record_is_lost_only_after_the_grace(slurm: SlurmCluster, tmp_path: Path) -> None:
    grace = 4.0

    def make() -> SlurmBackend:
        return _VanishedJob(ssh_options=slurm.ssh_options(), poll_s=0.5, lost_after_s=grace)

    async with supervised(tmp_path, make, slurm.config("local", tmp_path)) as h:
        run_id = await h.submit("true")
        run = await h.terminal(run_id)
        assert run.phase == "ERROR" and run.reason == "Lost", run
        assert "987654321" in (run.message or "") and "squeue, sacct, scontrol" in (run.message or ""), run
        events = await h.store.read_stream(run_id)
        handled = next(e.at for e in events if e.type == "HandleRecorded")
        ended = events[-1].at
        waited = (dt.datetime.fromisoformat(ended) - dt.datetime.fromisoformat(handled)).total_seconds()
        assert waited >= grace, (handled, ended)


async def test_logs_over_ssh_one_command_per_cycle_for_all_runs(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Three runs over ssh print for seconds: each cycle's one command
    reads every grown log; a run reads its log itself only at its end."""
    reads: list[str] = []

    def make() -> SlurmBackend:
        backend = slurm.backend()
        t = backend.transport(SSH_HOST)
        read_from = t.read_from

        async def counted(path: str, offset: int, max_bytes: int, *, timeout_s: float = 60.0) -> bytes:
            reads.append(path)
            return await read_from(path, offset, max_bytes, timeout_s=timeout_s)

        t.read_from = counted  # type: ignore[method-assign]
        return backend

    async with supervised(tmp_path, make, slurm.config("ssh", tmp_path)) as h:
        cmd = "for i in $(seq 1 16); do echo {n}-$i; sleep 0.25; done"
        ids = [await h.submit(cmd.format(n=n), name=f"r{n}") for n in range(3)]
        for n, run_id in enumerate(ids):
            run = await h.terminal(run_id)
            assert run.phase == "COMPLETED", run
            assert texts(await h.lines(run_id)) == [f"{n}-{i}" for i in range(1, 17)]
    # Lines arrived over many cycles, yet each run read its log itself only
    # for its last lines (and the failure tail it does not need here).
    assert len(reads) <= 2 * len(ids), reads
