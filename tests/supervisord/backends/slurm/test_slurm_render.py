"""``jobsup render --backend slurm`` prints the exact sbatch command and
wrapper (no daemon, no cluster); the backend meets the protocol."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from supervisord.daemon.backends.base import Backend
from supervisord.daemon.backends.slurm import SlurmBackend
from tests.supervisord.jobsup_env import JobsupEnv


def test_slurm_backend_is_a_backend() -> None:
    assert isinstance(SlurmBackend(), Backend)


def test_render_slurm_json_and_text(js: JobsupEnv, tmp_path: Path) -> None:
    js.user_config("slurm:\n  partition: gpu\n  remote_dir: /scratch/me/js\n  sbatch_args: [--mem=4G]\n")
    rid = "0123456789ab"
    r = js.cli(
        "render",
        "--backend",
        "slurm",
        "--run-id",
        rid,
        "--gpus",
        "2",
        "--timeout",
        "90s",
        "-o",
        "json",
        "--",
        "python",
        "train.py",
        "--lr",
        "3",
        cwd=tmp_path,
    )
    doc = json.loads(r.stdout)
    run_dir = f"/scratch/me/js/runs/{rid}"
    assert doc["sbatch"] == [
        "sbatch",
        "--parsable",
        f"--job-name=jobsup-{rid}",
        f"--comment=jobsup:{rid}",
        f"--output={run_dir}/output.log",
        "--open-mode=append",
        "--time=2",
        f"--chdir={run_dir}",
        "--partition=gpu",
        "--gpus=2",
        "--mem=4G",
        f"{run_dir}/job.sh",
    ]
    assert "bash -c 'python train.py --lr 3'" in doc["wrapper"]
    text = js.cli("render", "--backend", "slurm", "--run-id", rid, "--", "true", cwd=tmp_path).stdout
    assert shlex.join(doc["sbatch"][:5]) in text and "#!/bin/bash" in text
    bad = js.cli("render", "--backend", "slurm", "--gpus", "two", "--", "true", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --gpus"), bad.stderr
