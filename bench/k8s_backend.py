"""Benchmark: the Kubernetes backend supervising 500 runs at once on the
simulated cluster (docs/kubernetes.md).

The real daemon (a subprocess, reading the simulator's kubeconfig through
KUBECONFIG) gets N runs through its API. Each run's container prints a line,
then blocks reading its own FIFO (so nothing changes until the benchmark says
so), prints a second line and exits. The script prints:

- submit throughput and the time until every run is RUNNING;
- the daemon's CPU while all N runs are RUNNING and nothing changes
  (share of one core over ``--idle-s`` seconds, after ``--settle-s``), and
  its RSS then;
- the latency from a Job status change to its event: for each run, from the
  moment the simulator's store gives the Job its first terminal condition
  (``SuccessCriteriaMet``/``Complete``; taken from a listener on the
  simulator's object store, in this process) to the ``at`` of the run's
  COMPLETED event in the daemon's database; runs are released one every
  ``--release-interval-s`` seconds; median, p99, max;
- the daemon's peak RSS over the whole benchmark;
- the CPU seconds of the daemon and of the simulator's event-loop thread
  (which shares the machine with the daemon: its share of the latency)
  while the runs are released and finish, with the load average.

Targets: idle CPU < 5 % of a core; a status change becomes an event within
1 s. Usage: python bench/k8s_backend.py [--runs 500] [--idle-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import (  # noqa: E402
    BenchEnv,
    Figure,
    PeakRss,
    cpu_seconds,
    load_average,
    make_repo,
    parse_at,
    percentile,
    report,
    rss_bytes,
)

from tests.k8s_sim import SimCluster  # noqa: E402

MANIFEST = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: bench-{{JOBSUP_RUN}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: main
          image: docker.io/library/busybox:1.36
          command: ["bash", "-c", "eval \\"$JOBSUP_SCRIPT\\""]
"""


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--settle-s", type=float, default=20.0, help="wait after all RUNNING before measuring idle CPU")
    parser.add_argument("--idle-s", type=float, default=60.0, help="idle CPU measuring window")
    parser.add_argument("--release-interval-s", type=float, default=0.05, help="seconds between two runs released")
    parser.add_argument("--submitters", type=int, default=8, help="concurrent API clients submitting")
    args = parser.parse_args()
    n = args.runs
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 16 * n + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    fifo_dir = Path(f"/var/tmp/jobsup-bench-k8s-{os.getpid()}")  # outside the containers' private /tmp
    fifo_dir.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        os.mkfifo(fifo_dir / f"go-{i}")
    try:
        with BenchEnv("k8s") as env, SimCluster.start(env.root / "sim") as sim:
            _run(args, env, sim, fifo_dir)
    finally:
        for i in range(n):
            (fifo_dir / f"go-{i}").unlink(missing_ok=True)
        fifo_dir.rmdir()


def _run(args: argparse.Namespace, env: BenchEnv, sim: SimCluster, fifo_dir: Path) -> None:
    n = args.runs
    # Terminal-condition times of the Jobs, from the simulator's store.
    finished_at: dict[str, float] = {}
    state = sim._require_state()  # the simulator's in-process store (bench-only access)

    def on_change(ev: Any) -> None:
        if ev.resource.plural != "jobs" or ev.type == "DELETED":
            return
        name = ev.obj["metadata"]["name"]
        if name in finished_at:
            return
        for c in (ev.obj.get("status") or {}).get("conditions") or []:
            if c.get("type") in ("SuccessCriteriaMet", "Complete") and c.get("status") == "True":
                finished_at[name] = time.time()
                return

    sim._sync(state.store.listeners.append, on_change)

    config_dir = Path(env.env["XDG_CONFIG_HOME"]) / "jobsup"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "daemon.yaml").write_text(
        f"kubernetes:\n  context: {sim.contexts[0]}\n  namespace: {sim.namespace}\n  pod_ready_timeout_s: 300\n"
    )
    env.env["KUBECONFIG"] = str(sim.kubeconfig_path)
    repo = make_repo(env.root / "repo", {".jobsup/k8s.yaml": MANIFEST, "README": "bench\n"})
    pid = env.start_daemon()

    with PeakRss(pid) as peak:
        t0 = time.monotonic()

        def submit(i: int) -> str:
            body = {
                "task": {
                    "name": f"r{i}",
                    "run": f"echo started-{i}; cat {fifo_dir}/go-{i} > /dev/null; echo done-{i}",
                    "backend": "kubernetes",
                    "timeout_s": 3600,
                    "env": {},
                },
                "layers": [],
                "cwd": str(repo),
                "rev": "HEAD",
                "force": False,
            }
            with env.client() as client:
                return str(client.submit(body)["run"]["id"])

        with ThreadPoolExecutor(args.submitters) as pool:
            run_ids = list(pool.map(submit, range(n)))
        submit_s = time.monotonic() - t0
        print(f"submitted {n} runs in {submit_s:.1f}s", flush=True)

        with env.client() as client:
            while True:
                runs = client.runs(all=True)
                running = sum(1 for r in runs if r["phase"] == "RUNNING")
                bad = [r for r in runs if r["phase"] in ("ERROR", "CANCELED", "DELETED")]
                if bad:
                    raise RuntimeError(f"{len(bad)} runs failed, e.g. {bad[0]}")
                if running == n:
                    break
                if time.monotonic() - t0 > 900:
                    raise RuntimeError(f"only {running}/{n} runs RUNNING after 15 minutes")
                time.sleep(1.0)
        all_running_s = time.monotonic() - t0
        print(f"all {n} RUNNING after {all_running_s:.1f}s; settling {args.settle_s:g}s", flush=True)

        time.sleep(args.settle_s)
        cpu0, w0 = cpu_seconds(pid), time.monotonic()
        time.sleep(args.idle_s)
        idle_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - w0)
        idle_rss = rss_bytes(pid)
        print(f"idle: {100 * idle_cpu:.2f}% of a core, RSS {idle_rss / 2**20:.0f} MiB", flush=True)

        # Release the runs one by one.
        t1 = time.monotonic()
        sim_cpu0, daemon_cpu0, load0 = sim.cpu_seconds(), cpu_seconds(pid), load_average()[0]
        for i in range(n):
            fd = os.open(fifo_dir / f"go-{i}", os.O_WRONLY)
            os.write(fd, b"go\n")
            os.close(fd)
            time.sleep(args.release_interval_s)
        with env.client() as client:
            while True:
                runs = client.runs(all=True)
                if all(r["phase"] in ("COMPLETED", "ERROR", "CANCELED", "DELETED") for r in runs) and len(runs) == n:
                    break
                if time.monotonic() - t1 > 600:
                    raise RuntimeError("runs did not finish within 10 minutes")
                # Not more often: listing N runs twice a second was a third of
                # the daemon's busy time while runs finish (py-spy, 200 runs);
                # the latencies come from the events' times, not from here.
                time.sleep(3.0)
        release_s = time.monotonic() - t1
        sim_cpu, daemon_cpu = sim.cpu_seconds() - sim_cpu0, cpu_seconds(pid) - daemon_cpu0
        load1 = load_average()[0]
        print(
            f"release: {release_s:.1f}s wall; CPU: daemon {daemon_cpu:.1f}s, simulator's loop thread {sim_cpu:.1f}s;"
            f" load {load0:.1f} -> {load1:.1f}",
            flush=True,
        )
        peak_rss = peak.peak

    latencies, failed = _latencies(env, run_ids, finished_at)
    report(
        "k8s_backend",
        [
            Figure("runs", n, "runs"),
            Figure("submit_rate", n / submit_s, "runs/s"),
            Figure("all_running_s", all_running_s, "s"),
            Figure("idle_cpu_pct", 100 * idle_cpu, "% core", "< 5", 100 * idle_cpu < 5),
            Figure("idle_rss_mib", idle_rss / 2**20, "MiB"),
            Figure(
                "status_to_event_p50_ms",
                1000 * percentile(latencies, 50),
                "ms",
                "< 1000",
                percentile(latencies, 50) < 1,
            ),
            Figure(
                "status_to_event_p99_ms",
                1000 * percentile(latencies, 99),
                "ms",
                "< 1000",
                percentile(latencies, 99) < 1,
            ),
            Figure("status_to_event_max_ms", 1000 * max(latencies), "ms"),
            Figure("peak_rss_mib", peak_rss / 2**20, "MiB"),
            Figure("release_daemon_cpu_s", daemon_cpu, "s"),
            Figure("release_simulator_cpu_s", sim_cpu, "s"),
        ],
        {
            "not_completed": failed,
            "measured": len(latencies),
            "release_interval_s": args.release_interval_s,
            "release_wall_s": round(release_s, 1),
            "load_average_1m": [round(load0, 1), round(load1, 1)],
        },
    )


def _latencies(env: BenchEnv, run_ids: list[str], finished_at: dict[str, float]) -> tuple[list[float], int]:
    """(seconds from each Job's terminal condition to its COMPLETED event,
    how many runs did not complete)."""
    db = sqlite3.connect(f"file:{env.paths.database}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT run_id, at, data FROM events WHERE type = 'PhaseChanged'").fetchall()
    finally:
        db.close()
    completed = {run_id: parse_at(at) for run_id, at, data in rows if json.loads(data).get("phase") == "COMPLETED"}
    out = []
    for run_id in run_ids:
        job = f"bench-{run_id}"
        if run_id in completed and job in finished_at:
            out.append(completed[run_id] - finished_at[job])
    return out, len(run_ids) - len(completed)


if __name__ == "__main__":
    main()
