"""The Slurm backend through the real daemon and CLI (one daemon for the
module), on the real one-node Slurm: submit, logs, cancel, bad input at
submit, doctor, and a daemon killed mid-run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.slurm_env import SSH_HOST, SlurmCluster, cluster_or_skip, slurm_jobsup
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster() -> SlurmCluster:
    return cluster_or_skip()


@pytest.fixture(scope="module")
def js(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobsupEnv]:
    with slurm_jobsup(cluster, tmp_path_factory.mktemp("slurm-cli")) as env:
        yield env


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(
        tmp_path_factory.mktemp("proj") / "proj",
        {"count.sh": "for i in $(seq 1 $1); do echo n-$i; sleep ${2:-0}; done\n"},
    )


def lines(js: JobsupEnv, run_id: str) -> list[str]:
    out = js.cli("logs", run_id, "-o", "json").stdout
    return [json.loads(l)["text"] for l in out.splitlines() if l.strip()]


def test_submit_wait_logs_over_both_transports(js: JobsupEnv, repo: Path) -> None:
    local = js.submit(repo, "--backend", "slurm", "--name", "local3", "--", "bash count.sh 3")
    remote = js.submit(
        repo,
        "--backend",
        "slurm",
        "--name",
        "remote2",
        "--config",
        f"slurm.host={SSH_HOST}",
        "--config",
        "slurm.remote_dir=~/jobsup-cli-test",
        "--",
        "bash count.sh 2; exit 5",
    )
    assert js.cli("wait", local, "--timeout", "2m").returncode == 0
    assert js.cli("wait", remote, "--timeout", "2m", check=False).returncode == 1
    assert lines(js, local) == ["n-1", "n-2", "n-3"]
    assert lines(js, remote) == ["n-1", "n-2"]
    shown = js.show(remote)
    assert shown["phase"] == "ERROR" and shown["exit_code"] == 5 and shown["backend"] == "slurm", shown


def test_cancel_returns_once_the_job_left(js: JobsupEnv, repo: Path, cluster: SlurmCluster) -> None:
    run_id = js.submit(repo, "--backend", "slurm", "--", "echo up; sleep 300")
    js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "2m")
    job = str(js.show(run_id)["handle"]["job_id"])
    js.cli("cancel", run_id)
    assert js.show(run_id)["phase"] == "CANCELED"
    states = cluster.slurm("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").split()
    assert states in ([], ["CANCELLED"]), states


def test_bad_partition_is_refused_at_submit(js: JobsupEnv, repo: Path) -> None:
    before = js.cli("runs", "-o", "json").stdout
    r = js.cli(
        "submit", "--backend", "slurm", "--config", "slurm.partition=nosuch", "--", "true", cwd=repo, check=False
    )
    assert r.returncode == 2, r
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Invalid partition name" in err[0], r.stderr
    assert js.cli("runs", "-o", "json").stdout == before


def test_unreachable_host_is_refused_at_submit(js: JobsupEnv, repo: Path) -> None:
    r = js.cli(
        "submit",
        "--backend",
        "slurm",
        "--config",
        "slurm.host=jobsup-no-such-host.invalid",
        "--",
        "true",
        cwd=repo,
        check=False,
    )
    assert r.returncode != 0 and "jobsup-no-such-host.invalid" in r.stderr, r


def test_doctor_checks_slurm(js: JobsupEnv) -> None:
    doc = json.loads(js.cli("doctor", "-o", "json", check=False).stdout)
    checks = {c["name"]: c for c in (doc["checks"] if isinstance(doc, dict) else doc)}
    for name in ("slurm.reach", "slurm.version", "slurm.partition", "slurm.accounting", "slurm.remote_dir"):
        assert checks[name]["ok"], checks[name]
    assert "22.05" in checks["slurm.version"]["detail"]


def test_daemon_killed_mid_run_log_once(js: JobsupEnv, repo: Path, cluster: SlurmCluster) -> None:
    run_id = js.submit(repo, "--backend", "slurm", "--", "bash count.sh 30 0.2")
    js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "2m")
    deadline = time.monotonic() + 60
    while len(lines(js, run_id)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    js.kill_daemon()
    time.sleep(3)  # the job runs on and writes more while no daemon watches
    js.start_daemon(extra_env={"JOBSUP_SSH_CONFIG": str(cluster.ssh_config), **js.host_slurm()})
    assert js.cli("wait", run_id, "--timeout", "2m").returncode == 0
    assert lines(js, run_id) == [f"n-{i}" for i in range(1, 31)]


def test_job_that_ended_while_the_daemon_was_down(js: JobsupEnv, repo: Path, cluster: SlurmCluster) -> None:
    run_id = js.submit(repo, "--backend", "slurm", "--name", "ends-alone", "--", "bash count.sh 3 1; exit 6")
    js.cli("wait", run_id, "--for", "RUNNING", "--timeout", "2m")
    job = str(js.show(run_id)["handle"]["job_id"])
    js.kill_daemon()
    deadline = time.monotonic() + 60
    while cluster.slurm("squeue", "-h", "-j", job, "-o", "%T").split() not in ([], ["FAILED"]):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    js.start_daemon(extra_env={"JOBSUP_SSH_CONFIG": str(cluster.ssh_config), **js.host_slurm()})
    assert js.cli("wait", run_id, "--timeout", "2m", check=False).returncode == 1
    shown = js.show(run_id)
    assert shown["exit_code"] == 6 and shown["reason"] == "NonZeroExit", shown
    assert lines(js, run_id) == ["n-1", "n-2", "n-3"]


def test_gpus_reach_sbatch(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--backend", "slurm", "--name", "gpus", "--gpus", "2", "--", 'echo "gpus=$SLURM_JOB_GPUS"')
    assert js.cli("wait", run_id, "--timeout", "2m").returncode == 0
    (line,) = lines(js, run_id)
    assert line.startswith("gpus=") and len(line[5:].split(",")) == 2, line
