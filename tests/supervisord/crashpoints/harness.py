"""The crash-point tests' harness: a daemon that SIGKILLs itself at a named
step of the run protocol (``JOBSUP_TEST_CRASH_AT``, see
:mod:`supervisord.daemon.crashpoints`), a restart without it, and the invariants
every crash must keep:

* every accepted run (its Submitted recorded) ends, none is lost;
* it executes at most once (its job appends a line to a file outside the
  snapshot at each start), exactly once when it completed;
* its outcome is its runner's (phase, reason and exit code as the runner's
  final status says), and its last lines are recorded exactly once;
* no two runs use one GPU at the same time (a fake ``nvidia-smi``; each
  job notes its ``CUDA_VISIBLE_DEVICES`` and when it started and ended);
* no ``pending.json`` (env values) is left.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store import TERMINAL_PHASES
from supervisord.client.api import Client
from supervisord.daemon.crashpoints import ENV_VAR
from supervisord.shared.paths import Paths
from tests.supervisord.jobsup_env import JobsupEnv

__all__ = [
    "Case",
    "Execs",
    "check_invariants",
    "client",
    "configure",
    "crashed",
    "job_command",
    "log_lines",
    "run_ids",
    "start_daemon",
    "wait_all",
]

FAKE_SMI = "0, GPU-aaaa, Fake GPU, 1024 MiB\n"


def configure(js: JobsupEnv, *, gpus: bool, daemon_yaml: str = "") -> None:
    """Before the daemon starts: PATH with a fake ``nvidia-smi`` listing one
    GPU (``gpus``) or none, and ``daemon_yaml`` as the daemon's config."""
    bin_dir = js.root / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpus:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\ncat <<'EOF'\n" + FAKE_SMI + "EOF\n")
        smi.chmod(0o755)
    js.env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    if daemon_yaml:
        js.daemon_config(daemon_yaml)


def job_command(
    execs: Path, *, secs: float = 0.5, gate: Path | None = None, code: int = 0, key: str = "$JOBSUP_RUN_ID"
) -> str:
    """A job that appends ``start <key> <time> <GPUs>`` to ``execs``, sleeps
    ``secs`` (or waits for ``gate`` to exist), prints ``out``, appends ``end
    <key> <time>`` and exits ``code``. ``key``: the run id (local runs), or
    the run's name where the job has no ``JOBSUP_RUN_ID`` (Kubernetes)."""
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done" if gate is not None else f"sleep {secs}"
    return (
        f'echo "start {key} $(date +%s.%N) ${{CUDA_VISIBLE_DEVICES:-none}}" >> {execs}; '
        f'{wait}; echo out; echo "end {key} $(date +%s.%N)" >> {execs}; exit {code}'
    )


@dataclass
class Execs:
    """What the jobs noted: run id -> [start, end, gpus] per execution."""

    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Execs:
        self = cls()
        if not path.exists():
            return self
        for line in path.read_text().splitlines():
            kind, run_id, at, *rest = line.split()
            execs = self.runs.setdefault(run_id, [])
            if kind == "start":
                execs.append({"start": float(at), "end": None, "gpus": set(rest[0].split(",")) - {"none"}})
            else:
                open_ = [e for e in execs if e["end"] is None]
                if open_:
                    open_[0]["end"] = float(at)
        return self

    def gpu_overlaps(self) -> list[tuple[str, str]]:
        """Pairs of executions of different runs that used one GPU at the same time."""
        items = [(rid, e) for rid, es in self.runs.items() for e in es if e["gpus"]]
        bad = []
        for i, (ra, a) in enumerate(items):
            for rb, b in items[i + 1 :]:
                a_end = a["end"] if a["end"] is not None else float("inf")
                b_end = b["end"] if b["end"] is not None else float("inf")
                if ra != rb and a["gpus"] & b["gpus"] and a["start"] < b_end and b["start"] < a_end:
                    bad.append((ra, rb))
        return bad


@dataclass
class Case:
    """One crash-point case: its environment and what the driver learnt."""

    js: JobsupEnv
    point: str
    execs: Path
    submitted: list[str] = field(default_factory=list)  # run ids the CLI printed

    def start_crashing(self) -> None:
        """Start the daemon with the crash point set."""
        start_daemon(self.js, {ENV_VAR: self.point})

    def restart(self) -> None:
        """Start the daemon again, without a crash point."""
        start_daemon(self.js)

    def submit(self, repo: Path, *args: str) -> str | None:
        """Submit; the run id, or None when the daemon died meanwhile."""
        r = self.js.cli("submit", *args, cwd=repo, check=False)
        if r.returncode == 0:
            self.submitted.append(r.stdout.strip())
            return r.stdout.strip()
        assert self.js.daemon is not None and self.js.daemon.poll() is not None, r.stderr
        return None


def client(js: JobsupEnv) -> Client:
    """An API client of ``js``'s daemon, in this process (no CLI start-up per call)."""
    return Client(Paths(js.state_dir, js.socket))


def start_daemon(js: JobsupEnv, extra_env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
    """Start ``js``'s daemon and wait until it answers ``/health``."""
    daemon = js.start_daemon(extra_env=extra_env, wait=False)
    api = client(js)
    deadline = time.monotonic() + timeout
    while api.health() is None:
        if daemon.poll() is not None:
            if extra_env and daemon.returncode == -9:
                return  # died at its crash point already
            raise AssertionError(f"daemon exited {daemon.returncode}:\n{js.daemon_log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"daemon not ready:\n{js.daemon_log.read_text()[-3000:]}"
        time.sleep(0.02)


def crashed(js: JobsupEnv, timeout: float = 60.0) -> None:
    """Wait for the daemon to kill itself at its crash point; fail if it does not."""
    assert js.daemon is not None
    try:
        code = js.daemon.wait(timeout=timeout)
    except Exception as err:
        raise AssertionError(f"the daemon did not reach its crash point within {timeout:g}s") from err
    assert code == -9, f"the daemon exited {code}, not by its crash point:\n{js.daemon_log.read_text()[-3000:]}"


def run_ids(js: JobsupEnv) -> list[str]:
    """Every recorded run's id."""
    return [r["id"] for r in client(js).runs(all=True)]


def wait_all(js: JobsupEnv, ids: Iterable[str], timeout: float = 90.0) -> dict[str, dict[str, Any]]:
    """Wait until every run in ``ids`` is terminal; their run objects."""
    want = set(ids)
    api = client(js)
    deadline = time.monotonic() + timeout
    while True:
        runs = {r["id"]: r for r in api.runs(all=True) if r["id"] in want}
        if all(r["phase"] in TERMINAL_PHASES for r in runs.values()):
            return runs
        assert time.monotonic() < deadline, f"runs not terminal in time: {runs}"
        time.sleep(0.1)


def log_lines(js: JobsupEnv, run_id: str) -> list[str]:
    """The run's recorded log lines."""
    return b"".join(client(js).logs_text(run_id)).decode().splitlines()


def _wait_no_pending(js: JobsupEnv, timeout: float = 30.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while True:
        left = sorted((js.state_dir / "runs").glob("*/pending.json"))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def check_invariants(case: Case, *, expect: dict[str, str] | None = None, logs: bool = True) -> dict[str, Any]:
    """After the restart: wait for every recorded run and check the
    module's invariants. ``expect``: run id -> the phase it must end in
    (default COMPLETED for every run). ``logs``: check that each completed
    run's log is exactly ``out``. Returns the runs' ``show`` documents."""
    js = case.js
    ids = run_ids(js)
    assert set(case.submitted) <= set(ids), "a run the CLI answered for is not recorded"
    runs = wait_all(js, ids)
    execs = Execs.read(case.execs)
    for run_id, run in runs.items():
        want = (expect or {}).get(run_id, "COMPLETED")
        assert run["phase"] == want, (case.point, run)
        starts = execs.runs.get(run_id) or execs.runs.get(run["name"], [])
        assert len(starts) <= 1, f"{case.point}: run {run_id} executed {len(starts)} times"
        if want == "COMPLETED":
            assert len(starts) == 1, f"{case.point}: run {run_id} completed without executing"
            if logs:
                assert log_lines(js, run_id) == ["out"], (case.point, run_id)
        if run["backend"] == "local" and starts:
            status = js.runner_status(run_id)
            assert status["state"] == "exited", (case.point, status)
            want_reason = None if status["reason"] == "Completed" else status["reason"]
            assert (run["reason"], run.get("exit_code")) == (want_reason, status.get("exit_code")), (
                case.point,
                run,
                status,
            )
    assert execs.gpu_overlaps() == [], f"{case.point}: two runs used one GPU at once"
    names = {r["name"] for r in runs.values()}
    assert set(execs.runs) <= set(ids) | names, "a job executed for a run that is not recorded"
    left = _wait_no_pending(js)
    assert left == [], f"{case.point}: pending files left: {left}"
    return runs
