"""Bench: the Slurm backend on a local one-node Slurm (tests/slurm/cluster.sh).

A private cluster (128 CPUs by config, so every job runs at once) and a
private daemon. Two rounds of N jobs (``sleep``), each submitted back to
back:

* ``sbatch`` alone: ``sbatch --parsable --wrap 'sleep S'``, one process
  each; RUNNING is when a ``squeue`` poll (every 50 ms) first shows it;
* jobsup: ``POST /v1/runs`` with ``--backend slurm`` (one in-process API
  client); RUNNING is the ``at`` of the run's PhaseChanged RUNNING event
  (the daemon's poll runs every 2 s: that is most of the difference).

Then the daemon's CPU (``/proc``, user + system) over a window while all N
jobsup jobs run. A third round submits one sweep of N runs (one array job:
``sbatch --array``): submit -> each run's RUNNING, and how many ``sbatch``
calls slurmctld saw for it (1). Needs root and Debian's slurmctld, slurmd, slurm-client,
munge, openssh-server.

    python bench/slurm_submit.py            # N = 100, a 60 s window
    python bench/slurm_submit.py --small    # N = 20, a 20 s window
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from _harness import ROOT, BenchEnv, Figure, cpu_seconds, load_average, make_repo, parse_at, percentile, report

CLUSTER_SH = ROOT / "tests" / "slurm" / "cluster.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SqueueWatch:
    """First time each job id shows RUNNING in ``squeue`` (polled every 50 ms)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(
                ["squeue", "-h", "-t", "all", "-o", "%i|%T"], env=self.env, capture_output=True, text=True
            ).stdout
            now = time.time()
            for line in out.splitlines():
                jid, _, state = line.partition("|")
                if state == "RUNNING" and jid not in self.running:
                    self.running[jid] = now
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="20 jobs and a 20 s window")
    parser.add_argument("-n", type=int, help="jobs per round")
    args = parser.parse_args()
    n = args.n or (20 if args.small else 100)
    window_s = 20.0 if args.small else 60.0
    sleep_s = int(window_s + 90)

    where = Path(tempfile.mkdtemp(prefix="jobsup-bench-slurm-"))
    cenv = {
        **os.environ,
        "JOBSUP_SLURM_CTLD_PORT": str(_free_port()),
        "JOBSUP_SLURM_SLURMD_PORT": str(_free_port()),
        "JOBSUP_SLURM_SSH_PORT": str(_free_port()),
        "JOBSUP_SLURM_CPUS": "128",
        "JOBSUP_SLURM_MEMORY_MB": "64000",
    }
    subprocess.run([str(CLUSTER_SH), "up", str(where)], check=True, env=cenv, capture_output=True, timeout=120)
    senv = {**os.environ, "SLURM_CONF": str(where / "slurm.conf")}
    try:
        load_before = load_average()
        # Round 1: sbatch alone.
        watch = SqueueWatch(senv)
        t_sbatch: dict[str, float] = {}
        for _ in range(n):
            t0 = time.time()
            jid = subprocess.run(
                ["sbatch", "--parsable", "-o", "/dev/null", "--mem=10M", "--wrap", f"sleep {sleep_s}"],
                env=senv, check=True, capture_output=True, text=True,
            ).stdout.strip().split(";")[0]  # fmt: skip
            t_sbatch[jid] = t0
        deadline = time.monotonic() + 120
        while len([j for j in t_sbatch if j in watch.running]) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        watch.stop()
        sbatch_lat = [watch.running[j] - t for j, t in t_sbatch.items() if j in watch.running]
        subprocess.run(["scancel", *t_sbatch], env=senv, check=False)

        # Round 2: jobsup.
        with BenchEnv("slurm") as env:
            env.env["SLURM_CONF"] = str(where / "slurm.conf")
            repo = make_repo(env.root / "proj", {"README": "bench\n"})
            pid = env.start_daemon()
            jobsup_lat: list[float] = []
            with env.client() as client:
                t0s: dict[str, float] = {}
                for i in range(n):
                    body = env.submit_body(repo, f"sleep {sleep_s}", name=f"b{i}")
                    body["task"]["backend"] = "slurm"
                    body["layers"] = [
                        {"name": "cli", "file": None, "data": {"slurm": {"remote_dir": str(env.root / "remote"),
                                                                          "sbatch_args": ["--mem=10M"]}}}
                    ]  # fmt: skip
                    t0 = time.time()
                    run_id = client.submit(body)["run"]["id"]
                    t0s[run_id] = t0
                deadline = time.monotonic() + 180
                pending = set(t0s)
                while pending and time.monotonic() < deadline:
                    for run_id in list(pending):
                        for event in client.events(run=run_id):
                            if event.get("type") == "PhaseChanged" and event["data"].get("phase") == "RUNNING":
                                jobsup_lat.append(parse_at(event["at"]) - t0s[run_id])
                                pending.discard(run_id)
                                break
                    time.sleep(0.5)
                if pending:
                    raise RuntimeError(f"{len(pending)} runs never reached RUNNING:\n{env.log_tail()}")
                cpu0, w0 = cpu_seconds(pid), time.monotonic()
                time.sleep(window_s)
                cpu1, w1 = cpu_seconds(pid), time.monotonic()
                for run_id in t0s:
                    client.cancel(run_id)

            # Round 3: one sweep of n runs (one array job).
            with env.client() as client:
                log = where / "log" / "slurmctld.log"
                submits_before = log.read_text().count("_slurm_rpc_submit_batch_job")
                body = env.submit_body(repo, f"sleep {sleep_s}", name="sweep")
                body["task"].update(backend="slurm", sweep={"i": f"0..{n - 1}"})
                body["layers"] = [
                    {"name": "cli", "file": None, "data": {"slurm": {"remote_dir": str(env.root / "remote"),
                                                                      "sbatch_args": ["--mem=10M"]}}}
                ]  # fmt: skip
                t0 = time.time()
                sweep = client.submit(body)
                sweep_ids = list(sweep["run_ids"])
                sweep_lat: list[float] = []
                deadline = time.monotonic() + 180
                pending = set(sweep_ids)
                while pending and time.monotonic() < deadline:
                    for run_id in list(pending):
                        for event in client.events(run=run_id):
                            if event.get("type") == "PhaseChanged" and event["data"].get("phase") == "RUNNING":
                                sweep_lat.append(parse_at(event["at"]) - t0)
                                pending.discard(run_id)
                                break
                    time.sleep(0.5)
                if pending:
                    raise RuntimeError(f"{len(pending)} sweep runs never reached RUNNING:\n{env.log_tail()}")
                sweep_submits = log.read_text().count("_slurm_rpc_submit_batch_job") - submits_before
                client.cancel_sweep(str(sweep["sweep"]["id"]))
        load_after = load_average()
    finally:
        subprocess.run([str(CLUSTER_SH), "down", str(where)], check=False, timeout=120)
        shutil.rmtree(where, ignore_errors=True)

    cpu_pct = 100.0 * (cpu1 - cpu0) / (w1 - w0)
    figures = [
        Figure("sbatch_submit_to_running_p50_ms", statistics.median(sbatch_lat) * 1000, "ms"),
        Figure("sbatch_submit_to_running_p90_ms", percentile(sbatch_lat, 90) * 1000, "ms"),
        Figure("jobsup_submit_to_running_p50_ms", statistics.median(jobsup_lat) * 1000, "ms"),
        Figure("jobsup_submit_to_running_p90_ms", percentile(jobsup_lat, 90) * 1000, "ms"),
        Figure("daemon_cpu_while_jobs_run_pct", cpu_pct, "% of a core", "<= 1", cpu_pct <= 1.0),
        Figure("sweep_submit_to_running_p50_ms", statistics.median(sweep_lat) * 1000, "ms"),
        Figure("sweep_submit_to_running_p90_ms", percentile(sweep_lat, 90) * 1000, "ms"),
        Figure("sweep_sbatch_calls", float(sweep_submits), "calls", "== 1", sweep_submits == 1),
    ]
    report(
        "slurm_submit",
        figures,
        {"n": n, "window_s": window_s, "load_before": load_before, "load_after": load_after, "cores": os.cpu_count()},
    )


if __name__ == "__main__":
    main()
