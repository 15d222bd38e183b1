"""Bench: what sampling running local runs costs the daemon, how fast the
memory watchdog stops a run, and how fast ``jobsup top`` answers.

1. Cost. Two private daemons side by side, in the same time window, each
   with N local runs (``sleep 3600``, default N = 100): A samples every 5 s
   (the default ``local.usage_interval_s``), B every 3600 s (sampling off
   after its first pass: the peer). After every run is RUNNING and a settle
   time, each daemon's CPU seconds (utime + stime, /proc) are read over the
   same window (default 60 s). Target: (A - B) / window < 1% of a core.
   Also: ``GET /v1/top`` latency on A with N runs (the API ``jobsup top``
   calls), median of 20.
2. Watchdog. On daemon A, runs with ``--memory 64M`` whose job allocates
   200 MB at a moment it records; the time from that moment to the run's
   ended_at. Target: < 2 intervals (10 s).

    python bench/usage_sampling.py               # N = 100, window 60 s
    python bench/usage_sampling.py -n 20 --window 30
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time
from pathlib import Path

from _harness import BenchEnv, Figure, cpu_seconds, load_average, make_repo, parse_at, report

JOB = "sleep 3600"
HOG = (
    "import sys, time\n"
    "b = bytearray(200 << 20)\n"
    "b[::4096] = b'x' * len(b[::4096])\n"
    "open(sys.argv[1], 'w').write(str(time.time()))\n"
    "time.sleep(600)\n"
)


def _start(env: BenchEnv, interval: float) -> None:
    cfg = env.root / "daemon.yaml"
    cfg.write_text(f"local:\n  usage_interval_s: {interval}\n")
    env.env["JOBSUP_DAEMON_CONFIG"] = str(cfg)
    env.start_daemon()


def _submit_all(env: BenchEnv, repo: Path, n: int, prefix: str) -> list[str]:
    def submit(chunk: list[int]) -> list[str]:
        with env.client() as client:
            return [client.submit(env.submit_body(repo, JOB, name=f"{prefix}-{i:04d}"))["run"]["id"] for i in chunk]

    chunks = [list(range(i, n, 4)) for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return [rid for part in pool.map(submit, chunks) for rid in part]


def _wait_running(env: BenchEnv, ids: list[str], timeout_s: float = 1200) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with env.client() as client:
            runs = {r["id"]: r for r in client.runs(all=True)}
        if all(runs[i]["phase"] == "RUNNING" for i in ids):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("not every run RUNNING in time")
        time.sleep(1.0)


def measure(n: int, window: float, settle: float, oom_trials: int) -> None:
    with BenchEnv("usage-on") as on, BenchEnv("usage-off") as off:
        repo = make_repo(on.root / "proj", {"README": "bench\n", "hog.py": HOG})
        _start(on, 5.0)
        _start(off, 3600.0)
        ids_on = _submit_all(on, repo, n, "on")
        ids_off = _submit_all(off, repo, n, "off")
        _wait_running(on, ids_on)
        _wait_running(off, ids_off)
        time.sleep(settle)
        assert on.daemon is not None and off.daemon is not None
        a0, b0, t0 = cpu_seconds(on.daemon.pid), cpu_seconds(off.daemon.pid), time.monotonic()
        time.sleep(window)
        a1, b1, t1 = cpu_seconds(on.daemon.pid), cpu_seconds(off.daemon.pid), time.monotonic()
        load = load_average()
        span = t1 - t0
        on_pct, off_pct = 100 * (a1 - a0) / span, 100 * (b1 - b0) / span
        with on.client() as client:
            doc = client.top()
            sampled = len(doc["runs"])
            lat = []
            for _ in range(20):
                t = time.perf_counter()
                client.top()
                lat.append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        on.cli("top", "--once")
        top_cli_ms = 1000 * (time.perf_counter() - t)
        # the watchdog
        stops = []
        for i in range(oom_trials):
            marker = on.root / f"hog-{i}.at"
            with on.client() as client:
                body = on.submit_body(repo, f"{sys.executable} hog.py {marker}", name=f"hog-{i}")
                body["task"]["memory"] = "64M"
                rid = client.submit(body)["run"]["id"]
            deadline = time.monotonic() + 120
            while True:
                with on.client() as client:
                    run = client.show(rid)["run"]
                if run["phase"] in ("ERROR", "COMPLETED", "CANCELED"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hog run {rid} not stopped within 120 s: {run}")
                time.sleep(0.2)
            if run["reason"] != "OOMKilled":
                raise RuntimeError(f"hog run ended {run['phase']} {run['reason']}: {run['message']}")
            stops.append(parse_at(run["ended_at"]) - float(marker.read_text()))
        # (leaving the with blocks kills both daemons and every run left)
    figures = [
        Figure("runs_per_daemon", n, "runs"),
        Figure("runs_sampled", sampled, "runs", str(n), sampled == n),
        Figure("window_s", span, "s"),
        Figure("daemon_cpu_sampling_on_pct", on_pct, "% of a core"),
        Figure("daemon_cpu_sampling_off_pct", off_pct, "% of a core"),
        Figure("sampling_cost_pct", on_pct - off_pct, "% of a core", "< 1", on_pct - off_pct < 1.0),
        Figure("api_top_median_ms", statistics.median(lat), "ms"),
        Figure("cli_top_once_ms", top_cli_ms, "ms"),
        Figure(
            "watchdog_stop_max_s",
            max(stops) if stops else 0.0,
            "s",
            "< 10 (2 intervals)",
            bool(stops) and max(stops) < 10,
        ),
        Figure("watchdog_stop_median_s", statistics.median(stops) if stops else 0.0, "s"),
    ]
    report(
        f"usage_sampling n={n}", figures, {"load": load, "cores": os.cpu_count(), "stops_s": stops, "api_top_ms": lat}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=100, help="running runs per daemon (default 100)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the CPU is measured over (default 60)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after every run is RUNNING (default 15)")
    parser.add_argument("--oom-trials", type=int, default=3, help="watchdog trials (default 3)")
    args = parser.parse_args()
    measure(args.n, args.window, args.settle, args.oom_trials)


if __name__ == "__main__":
    main()
