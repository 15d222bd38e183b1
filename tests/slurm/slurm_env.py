"""The local test cluster (tests/slurm/cluster.sh) as the tests see it.

``JOBSUP_TEST_SLURM`` names the folder ``cluster.sh up`` ran in; without it
(or when that cluster is not up) every Slurm test is skipped. Two
transports: ``local`` (the Slurm commands of this machine, as the user
running the tests) and ``ssh`` (``ssh jobsup-slurm-citest``: the user
``citest`` on the sshd that ``cluster.sh`` started, through its ssh config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisord.daemon.backends.slurm import SlurmBackend
from tests.supervisord.backends.conformance import BackendHarness, SupervisorHarness
from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env

__all__ = ["SSH_HOST", "TRANSPORTS", "SlurmCluster", "cluster_or_skip", "supervised", "texts"]

TRANSPORTS = ("local", "ssh")
SSH_HOST = "jobsup-slurm-citest"
CLUSTER_SH = Path(__file__).with_name("cluster.sh")


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    """The cluster's folder and what tests need of it."""

    dir: Path

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh" / "config"

    def ssh_options(self) -> list[str]:
        return ["-F", str(self.ssh_config)]

    def backend(self, **kw: Any) -> SlurmBackend:
        """A backend that reaches the test sshd (and fast cycles)."""
        kw.setdefault("poll_s", 0.5)
        return SlurmBackend(ssh_options=self.ssh_options(), **kw)

    def config(self, transport: str, local_dir: Path) -> dict[str, Any]:
        """The run config of ``transport``: remote_dir under ``local_dir``
        (local) or under citest's home (ssh)."""
        if transport == "local":
            return {"slurm": {"remote_dir": str(local_dir / "slurm-remote")}}
        return {"slurm": {"host": SSH_HOST, "remote_dir": f"~/jobsup-tests/{secrets.token_hex(4)}"}}

    def sh(self, *args: str) -> None:
        """Run ``cluster.sh ARGS DIR`` (ctld-stop, ctld-start)."""
        subprocess.run([str(CLUSTER_SH), *args, str(self.dir)], check=True, timeout=120)

    def slurm(self, *argv: str, user: str | None = None) -> str:
        """A Slurm command's stdout (as ``user`` through runuser when given)."""
        full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        return subprocess.run(full, check=True, capture_output=True, text=True, timeout=60, env=env).stdout


def cluster_or_skip() -> SlurmCluster:
    """The cluster of ``JOBSUP_TEST_SLURM``, or skip the test."""
    where = os.environ.get("JOBSUP_TEST_SLURM")
    if not where:
        pytest.skip("no test Slurm cluster (JOBSUP_TEST_SLURM unset; tests/slurm/cluster.sh up DIR starts one)")
    cluster = SlurmCluster(Path(where))
    if not (cluster.dir / "env").is_file():
        pytest.skip(f"the test Slurm cluster in {where} is not up (no {where}/env)")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    return cluster


@contextlib.asynccontextmanager
async def supervised(
    root: Path, make: Any, config: dict[str, Any], *, files: dict[str, str] | None = None
) -> AsyncIterator[SupervisorHarness]:
    """A supervisor over a real store in ``root`` driving ``make()`` (a
    SlurmBackend) with run ``config``; ``files``: more repository files."""
    h = BackendHarness(name="slurm", make=make, config=config, stderr_stream="stdout", repo_files=files or {})
    gen = SupervisorHarness.open(root, h)
    sh = await gen.__anext__()
    try:
        yield sh
    finally:
        # Run the generator to its end (as pytest does for a fixture): it
        # cancels its task group, closes the backend and the store.
        with contextlib.suppress(StopAsyncIteration):
            await gen.__anext__()


@contextlib.contextmanager
def slurm_jobsup(cluster: SlurmCluster, root: Path) -> Iterator[JobsupEnv]:
    """A real daemon in ``root`` that reaches ``cluster`` (its ssh config and
    this host's Slurm commands), with its remote dir under ``root``."""
    with jobsup_env(root) as env:
        env.user_config(f"slurm:\n  remote_dir: {root / 'remote'}\n")
        env.start_daemon(extra_env={"JOBSUP_SSH_CONFIG": str(cluster.ssh_config), **env.host_slurm()})
        yield env


def texts(lines: list[tuple[str, str]]) -> list[str]:
    """The texts of ``(stream, text)`` log lines."""
    return [t for _, t in lines]
