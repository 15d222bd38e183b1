"""The CI run, as the README's test command runs it: ``python -m tests.ci``.

Four steps, in order, stopping at the first that fails:

1. lint: ``ruff check``, ``ruff format --check``, ``mypy`` (strict, as
   configured in pyproject.toml) and ``lint-imports`` (the layering
   contracts), each on the whole tree, each reporting all it finds;
2. tests: ``python -m pytest -q -n 4 --dist loadfile`` with any arguments
   given here (``python -m tests.ci -x -k wait``). Four pytest-xdist
   workers on two cores: most tests wait on real daemons, jobs and a
   simulated cluster, not on the CPU (about 10 minutes instead of 35);
3. the tests marked ``gpus`` again, on a host that seems to have GPUs and a
   cluster: a fake ``nvidia-smi`` listing two GPUs first on PATH,
   ``CUDA_VISIBLE_DEVICES`` set and ``KUBECONFIG`` naming a broken file.
   Every test's daemon must be independent of the host
   (tests/supervisord/jobsup_env.py): these pass there as here;
4. the store's tests (tests/store) again without its C accelerator
   (``JOBSUP_STORE_NO_ACCEL=1``: the bytes-method fallback that an install
   without a C compiler uses).

Steps 3 and 4 are skipped when arguments for pytest are given.

``--lint-only`` / ``--tests-only`` run one step. Exit code: the failing
step's, else 0 (pytest's 5, "no tests collected", counts as a failure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["LINT", "main"]

ROOT = Path(__file__).resolve().parent.parent

#: name -> argv (tools from the same environment as this interpreter).
LINT: dict[str, list[str]] = {
    "ruff check": [sys.executable, "-m", "ruff", "check", "."],
    "ruff format --check": [sys.executable, "-m", "ruff", "format", "--check", "."],
    "mypy": [sys.executable, "-m", "mypy"],
    "lint-imports": ["lint-imports"],
}


#: What the fake ``nvidia-smi`` of step 3 prints (its csv,noheader query).
HOST_GPUS = "0, GPU-host-0000, NVIDIA Host GPU, 81920 MiB\n1, GPU-host-1111, NVIDIA Host GPU, 81920 MiB\n"


def _host_with_gpus(folder: Path) -> dict[str, str]:
    """The environment of step 3, its files made in ``folder``."""
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{HOST_GPUS}EOF\n")
    smi.chmod(0o755)
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text("this: is [not a kubeconfig\n")
    return {
        **os.environ,
        "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}",
        "CUDA_VISIBLE_DEVICES": "0",
        "KUBECONFIG": str(kubeconfig),
    }


def _run(name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    if argv[0] == "lint-imports":
        exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
        if exe is None:
            print("ci: lint-imports is not installed (pip install -e '.[test]')", file=sys.stderr)
            return 1
        argv = [exe, *argv[1:]]
    print(f"ci: {name}", file=sys.stderr, flush=True)
    start = time.monotonic()
    rc = subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode
    print(
        f"ci: {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - start:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    return rc


def main(argv: list[str]) -> int:
    """Run the steps; ``argv`` are this command's arguments."""
    lint = "--tests-only" not in argv
    tests = "--lint-only" not in argv
    pytest_args = [a for a in argv if a not in ("--lint-only", "--tests-only")]
    if lint:
        failed = [name for name, cmd in LINT.items() if _run(name, cmd) != 0]
        if failed:
            print(f"ci: lint failed: {', '.join(failed)}", file=sys.stderr)
            return 1
    if tests:
        rc = _run("pytest", [sys.executable, "-m", "pytest", "-q", "-n", "4", "--dist", "loadfile", *pytest_args])
        if rc != 0 or pytest_args:
            return 1 if rc == 5 else rc
        with tempfile.TemporaryDirectory(prefix="jobsup-ci-host-") as folder:
            env = _host_with_gpus(Path(folder))
            rc = _run(
                "pytest -m gpus (a host with GPUs)",
                [sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "gpus", "tests/supervisord"],
                env,
            )
        if rc != 0:
            return 1 if rc == 5 else rc
        rc = _run(
            "pytest tests/store (no C accelerator)",
            [sys.executable, "-m", "pytest", "-q", "-n", "2", "tests/store"],
            {**os.environ, "JOBSUP_STORE_NO_ACCEL": "1"},
        )
        return 1 if rc == 5 else rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
