"""The Slurm backend on the real one-node Slurm (tests/slurm/cluster.sh):
what the conformance suite does not cover. A supervisor over a real store
drives a real SlurmBackend; jobs run for real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest

from supervisord.daemon.backends.slurm import SlurmBackend
from supervisord.daemon.backends.slurm.transport import SshTransport
from tests.slurm.slurm_env import SSH_HOST, SlurmCluster, supervised, texts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


async def test_exit_code_and_env_file_removed(slurm: SlurmCluster, transport: str, tmp_path: Path) -> None:
    config = slurm.config(transport, tmp_path)
    async with supervised(tmp_path, slurm.backend, config) as h:
        run_id = await h.submit('stat -c "%n %a" ../env.sh; echo "secret=$TOKEN"; exit 3', env={"TOKEN": "s3cr3t-v"})
        run = await h.terminal(run_id)
        assert run.phase == "ERROR" and run.reason == "NonZeroExit" and run.exit_code == 3, run
        lines = texts(await h.lines(run_id))
        assert "secret=s3cr3t-v" in lines
        # The env file is there (0600) while the job runs (a requeue reads it
        # again), and gone once it ended.
        assert "../env.sh 600" in lines
        assert run.handle is not None and str(run.handle["job_id"]).isdigit()
        assert not os.path.exists(f"{run.handle['run_dir']}/env.sh")


async def test_canceled_behind_jobsups_back(slurm: SlurmCluster, transport: str, tmp_path: Path) -> None:
    async with supervised(tmp_path, slurm.backend, slurm.config(transport, tmp_path)) as h:
        run_id = await h.submit("echo up; sleep 300")
        run = await h.wait_until(run_id, lambda r: r.phase == "RUNNING")
        assert run.handle is not None
        slurm.slurm("scancel", str(run.handle["job_id"]), user="citest" if transport == "ssh" else None)
        run = await h.terminal(run_id)
        assert run.phase == "CANCELED" and run.reason == "Canceled", run
        assert "outside jobsup" in (run.message or ""), run


async def test_pending_on_resources_shows_the_reason(slurm: SlurmCluster, tmp_path: Path) -> None:
    # A job outside jobsup holds a GPU of the "tiny" partition; the run asks
    # for all four there, so it waits (Resources) until the blocker goes.
    blocker = slurm.slurm("sbatch", "--parsable", "-p", "tiny", "--gpus=1", "-o", "/dev/null", "--wrap", "sleep 300")
    try:
        config = slurm.config("local", tmp_path)
        config["slurm"].update(partition="tiny", sbatch_args=["--gpus=4"])
        async with supervised(tmp_path, slurm.backend, config) as h:
            run_id = await h.submit("echo got-them")
            run = await h.wait_until(run_id, lambda r: r.reason == "WaitingForSlurm")
            assert run.phase == "SCHEDULING" and "PENDING" in (run.message or ""), run
            run = await h.wait_until(run_id, lambda r: "Resources" in (r.message or "") or r.terminal)
            assert "Resources" in (run.message or ""), run
            slurm.slurm("scancel", blocker.strip())
            run = await h.terminal(run_id)
            assert run.phase == "COMPLETED", run
            assert "got-them" in texts(await h.lines(run_id))
    finally:
        subprocess.run(["scancel", blocker.strip()], check=False)


async def test_over_memory_is_oomkilled(slurm: SlurmCluster, tmp_path: Path) -> None:
    config = slurm.config("local", tmp_path)
    config["slurm"]["sbatch_args"] = ["--mem=40M"]
    async with supervised(tmp_path, slurm.backend, config) as h:
        run_id = await h.submit("python3 -c 'import time; b = bytearray(400 << 20); time.sleep(30)'")
        run = await h.terminal(run_id, timeout_s=90)
        assert run.phase == "ERROR" and run.reason == "OOMKilled", run


async def test_restart_mid_run_records_each_line_once(slurm: SlurmCluster, transport: str, tmp_path: Path) -> None:
    """The supervisor and backend go away mid-run (as with a killed daemon)
    and a new pair reattaches by the recorded job id: every line once."""
    config = slurm.config(transport, tmp_path)
    cmd = "for i in $(seq 1 40); do echo line-$i; sleep 0.1; done"
    async with supervised(tmp_path, slurm.backend, config) as h:
        run_id = await h.submit(cmd)
        await h.wait_until(run_id, lambda r: r.phase == "RUNNING")
        with anyio.fail_after(60):
            while len(await h.lines(run_id)) < 3:
                await anyio.sleep(0.2)
    # The first supervisor is gone; the job ran on. A new one reattaches.
    # (files: a new commit, since the harness commits its repository again)
    async with supervised(tmp_path, slurm.backend, config, files={"again.txt": "x\n"}) as h2:
        assert await h2.supervisor.reattach_all() == 1
        run = await h2.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert texts(await h2.lines(run_id)) == [f"line-{i}" for i in range(1, 41)]


async def test_ssh_connection_dropped_mid_follow(slurm: SlurmCluster, tmp_path: Path) -> None:
    backends: list[SlurmBackend] = []

    def make() -> SlurmBackend:
        backends.append(slurm.backend())
        return backends[-1]

    async with supervised(tmp_path, make, slurm.config("ssh", tmp_path)) as h:
        run_id = await h.submit("for i in $(seq 1 30); do echo line-$i; sleep 0.2; done")
        await h.wait_until(run_id, lambda r: r.phase == "RUNNING")
        transport = backends[0].transports[SSH_HOST]
        assert isinstance(transport, SshTransport)
        with anyio.fail_after(60):
            while len(await h.lines(run_id)) < 3:
                await anyio.sleep(0.2)
        pid = await transport.master_pid()
        assert pid is not None
        os.kill(pid, 9)  # the shared connection drops
        run = await h.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert texts(await h.lines(run_id)) == [f"line-{i}" for i in range(1, 31)]
        assert transport.masters_started >= 2


async def test_two_users_jobs_are_not_confused(slurm: SlurmCluster, tmp_path: Path) -> None:
    """root (local commands) and citest (ssh) run the same command at once;
    a job of citest's named like root's run changes nothing."""
    async with (
        supervised(tmp_path / "a", slurm.backend, slurm.config("local", tmp_path)) as ha,
        supervised(tmp_path / "b", slurm.backend, slurm.config("ssh", tmp_path)) as hb,
    ):
        a = await ha.submit('echo "me=$(id -un)"; sleep 2')
        b = await hb.submit('echo "me=$(id -un)"; sleep 2; exit 4')
        slurm.slurm(
            "sbatch",
            f"--job-name=jobsup-{a}",
            f"--comment=jobsup:{a}",
            "-o",
            "/dev/null",
            "--wrap",
            "exit 7",
            user="citest",
        )
        ra, rb = await ha.terminal(a), await hb.terminal(b)
        assert ra.phase == "COMPLETED" and rb.exit_code == 4, (ra, rb)
        assert texts(await ha.lines(a)) == ["me=root"]
        assert texts(await hb.lines(b)) == ["me=citest"]
        assert ra.handle is not None and rb.handle is not None and ra.handle["job_id"] != rb.handle["job_id"]
