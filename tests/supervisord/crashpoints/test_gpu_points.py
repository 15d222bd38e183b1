"""A daemon killed at each step of a local run's life, with runs waiting for
the machine's one GPU (a fake ``nvidia-smi``): after a restart no two runs
ever use the GPU at once, and every run executes once (see harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.supervisord.crashpoints.harness import Execs, check_invariants
from tests.supervisord.crashpoints.test_local_points import RUN_POINTS, drive_runs
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})


@pytest.mark.parametrize("point", RUN_POINTS)
def test_gpu_runs_survive_a_crash_at(js: JobsupEnv, repo: Path, tmp_path: Path, point: str) -> None:
    case = drive_runs(js, repo, tmp_path, point, gpus=True)
    check_invariants(case)
    execs = Execs.read(case.execs)
    assert execs.runs and all(e["gpus"] == {"GPU-aaaa"} for es in execs.runs.values() for e in es), execs
