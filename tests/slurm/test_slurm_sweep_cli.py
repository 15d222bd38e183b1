"""Slurm sweeps as array jobs, and --memory/--cpus, through the real daemon
and CLI on the real one-node Slurm (tests/slurm/cluster.sh)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.slurm_env import SSH_HOST, SlurmCluster, cluster_or_skip, slurm_jobsup
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> SlurmCluster:
    return cluster_or_skip()


@pytest.fixture(scope="module")
def js(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsupEnv]:
    with slurm_jobsup(cluster, tmp_path_factory.mktemp("slurm-sweep")) as env:
        yield env


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("proj") / "proj", {"say.sh": 'echo "i=$1 p=$JOBSUP_PARAM_I"\n'})


def lines(js: JobsupEnv, run_id: str) -> list[str]:
    out = js.cli("logs", run_id, "-o", "json").stdout
    return [json.loads(l)["text"] for l in out.splitlines() if l.strip()]


def run_ids(js: JobsupEnv, sweep_id: str) -> list[str]:
    rows = json.loads(js.cli("runs", "--sweep", sweep_id, "-o", "json").stdout)["rows"]
    return [str(r["id"]) for r in sorted(rows, key=lambda r: int(r["index"]))]


def sweep_runs(js: JobsupEnv, sweep_id: str) -> list[dict[str, Any]]:
    return [js.show(r) for r in run_ids(js, sweep_id)]


def wait_submitted(js: JobsupEnv, sweep_id: str, count: int) -> list[dict[str, Any]]:
    """The sweep's rows once every run is RUNNING or waiting for Slurm."""
    deadline = time.monotonic() + 120
    while True:
        rows = json.loads(js.cli("runs", "--sweep", sweep_id, "-o", "json").stdout)["rows"]
        if len(rows) == count and all(r["phase"] == "RUNNING" or r["reason"] == "WaitingForSlurm" for r in rows):
            return sorted(rows, key=lambda r: int(r["index"]))
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)


@pytest.mark.parametrize("where", ["local", "ssh"])
def test_sweep_is_one_array_job_with_its_max_parallel(
    js: JobsupEnv, repo: Path, cluster: SlurmCluster, where: str
) -> None:
    extra = ["--config", f"slurm.host={SSH_HOST}", "--config", "slurm.remote_dir=~/jobsup-sweep-test"]
    sweep_id = js.cli(
        "submit",
        "--backend",
        "slurm",
        "--sweep",
        "i=0..2",
        "--max-parallel",
        "1",
        *(extra if where == "ssh" else []),
        "--",
        "bash say.sh {i}; exit $(( {i} == 1 ? 4 : 0 ))",
        cwd=repo,
    ).stdout.strip()
    assert js.cli("wait", sweep_id, "--timeout", "3m", check=False).returncode == 1  # one run failed
    runs = sweep_runs(js, sweep_id)
    array_ids = {r["handle"]["array_job_id"] for r in runs}
    assert len(array_ids) == 1, runs  # one sbatch for the sweep
    (array_id,) = array_ids
    assert [r["handle"]["job_id"] for r in runs] == [f"{array_id}_{i}" for i in range(3)]
    assert [(r["phase"], r["exit_code"]) for r in runs] == [("COMPLETED", 0), ("ERROR", 4), ("COMPLETED", 0)]
    # Each task's log, exactly once, in its own run (with its own env file).
    assert [lines(js, r["id"]) for r in runs] == [[f"i={i} p={i}"] for i in range(3)]
    shown = cluster.slurm("scontrol", "show", "job", array_id)
    assert "ArrayTaskThrottle=1" in shown, shown
    assert len(re.findall(r"^JobId=", shown, re.M)) == 3, shown


def test_cancel_one_run_then_the_sweep(js: JobsupEnv, repo: Path, cluster: SlurmCluster) -> None:
    """More runs than the API cancels at once (16): still one scancel."""
    count = 18
    sweep_id = js.cli(
        "submit",
        "--backend",
        "slurm",
        "--sweep",
        f"i=0..{count - 1}",
        "--max-parallel",
        "2",
        "--",
        "echo up-{i}; sleep 300",
        cwd=repo,
    ).stdout.strip()
    rows = wait_submitted(js, sweep_id, count)
    first, second, last = (js.show(rows[i]["id"]) for i in (0, 1, count - 1))
    array_id = first["handle"]["array_job_id"]
    js.cli("wait", first["id"], second["id"], "--for", "RUNNING", "--timeout", "2m")
    assert last["reason"] == "WaitingForSlurm"  # %2: Slurm holds it
    # One run: its task only.
    js.cli("cancel", first["id"])
    assert js.show(first["id"])["phase"] == "CANCELED"
    assert js.show(second["id"])["phase"] == "RUNNING"
    # The sweep: the array, in one scancel.
    js.cli("cancel", sweep_id)
    rows = json.loads(js.cli("runs", "--sweep", sweep_id, "-o", "json").stdout)["rows"]
    assert [r["phase"] for r in rows] == ["CANCELED"] * count
    kills = re.findall(rf"REQUEST_KILL_JOB JobId=({array_id}\S*) ", (cluster.dir / "log" / "slurmctld.log").read_text())
    assert kills == [f"{array_id}_0", array_id], kills
    states = cluster.slurm("squeue", "-h", "-t", "all", "-r", "-j", array_id, "-o", "%T").split()
    assert set(states) <= {"CANCELLED"}, states


def test_memory_and_cpus_reach_sbatch(js: JobsupEnv, repo: Path, cluster: SlurmCluster) -> None:
    run_id = js.submit(
        repo, "--backend", "slurm", "--memory", "300M", "--cpus", "2", "--", 'echo "cpus=$SLURM_CPUS_PER_TASK"'
    )
    assert js.cli("wait", run_id, "--timeout", "2m").returncode == 0
    assert lines(js, run_id) == ["cpus=2"]
    shown = cluster.slurm("scontrol", "show", "job", str(js.show(run_id)["handle"]["job_id"]))
    assert "MinMemoryNode=300M" in shown and "NumCPUs=2" in shown, shown


def test_daemon_killed_mid_sweep_reattaches_each_task(js: JobsupEnv, repo: Path, cluster: SlurmCluster) -> None:
    sweep_id = js.cli(
        "submit",
        "--backend",
        "slurm",
        "--sweep",
        "i=0..1",
        "--max-parallel",
        "1",
        "--",
        "for j in $(seq 1 12); do echo {i}-$j; sleep 0.25; done",
        cwd=repo,
    ).stdout.strip()
    rows = wait_submitted(js, sweep_id, 2)
    deadline = time.monotonic() + 60
    while len(lines(js, rows[0]["id"])) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    js.kill_daemon()
    time.sleep(2)  # task 0 writes on, task 1 may start, while no daemon watches
    js.start_daemon(extra_env={"JOBSUP_SSH_CONFIG": str(cluster.ssh_config), **js.host_slurm()})
    assert js.cli("wait", sweep_id, "--timeout", "2m").returncode == 0
    for i, row in enumerate(rows):
        assert lines(js, row["id"]) == [f"{i}-{j}" for j in range(1, 13)]
