"""Bench: reattaching to N running local jobs after ``kill -9`` of the daemon (N = 500).

Set-up: one private daemon; N local runs submitted over the API (8 client
threads), each ``while :; do echo "tick $EPOCHREALTIME"; sleep 5; done``
(sleeping mostly, a line every 5 s). The bench waits until every run is
RUNNING and has recorded a line, then measures the daemon at rest for 10 s:
RSS and CPU use with N runs supervised.

Then the daemon gets SIGKILL. From the database (read-only, with the daemon
dead) the bench takes each run's recorded line count, waits 6 s (more than
a tick, so every job has printed at least one line no daemon read), and
starts a new daemon. Measured from that spawn:

* ``api_ready_s``: until ``GET /v1/health`` answers. The daemon serves only
  after re-reading every non-terminal run and starting its supervision task,
  so this is when health first reports all N ``supervised``;
* ``all_reattached_s`` (the probe): until every one of the N runs has
  recorded more lines than it had when the old daemon died, i.e. each run's
  tailer resumed from its recorded position and ingested the lines printed
  while no daemon ran (``GET /v1/runs?all=1`` polled every 100 ms);
* ``supervised_after_api_s``: the difference (the aim: 0.5 s), and the
  new daemon's CPU seconds up to each of the two moments;
* the new daemon's RSS once all are reattached and its peak during the
  reattach (target < 150 MB).

Finally ``jobsup cancel`` (the real CLI) with all N run ids, timed, then a
check that every run is CANCELED and that no runner and no process of any
job's process group remains.

    python bench/local_reattach.py            # N = 500
    python bench/local_reattach.py --small    # N = 50
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import BenchEnv, Figure, PeakRss, cpu_seconds, load_average, make_repo, report, rss_bytes

JOB = 'while :; do echo "tick $EPOCHREALTIME"; sleep 5; done'
TICK_S = 5.0


def submit_all(env: BenchEnv, repo: Path, n: int) -> list[str]:
    """Submit ``n`` runs named ``job-0000``... from 8 threads; their ids."""

    def submit(chunk: list[int]) -> list[str]:
        with env.client() as client:
            return [client.submit(env.submit_body(repo, JOB, name=f"job-{i:04d}"))["run"]["id"] for i in chunk]

    chunks = [list(range(i, n, 8)) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return [run_id for ids in pool.map(submit, chunks) for run_id in ids]


def runs_by_id(env: BenchEnv) -> dict[str, dict[str, Any]]:
    """Every run, from ``GET /v1/runs?all=1``."""
    with env.client() as client:
        return {r["id"]: r for r in client.runs(all=True)}


def wait_until(what: str, check: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> float:
    """Poll ``check()`` until true; returns the seconds it took. Raises
    RuntimeError naming ``what`` after ``timeout_s``."""
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout_s:
            raise RuntimeError(f"{what}: not reached within {timeout_s:g}s")
        time.sleep(poll_s)
    return time.perf_counter() - start


def recorded_lines(database: Path) -> dict[str, int]:
    """Each run's recorded line count, read from the database file directly
    (read-only; only while no daemon runs)."""
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return {str(r[0]): int(r[1]) for r in conn.execute("SELECT id, log_lines FROM runs")}
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="50 runs instead of 500")
    parser.add_argument("-n", type=int, help="runs")
    args = parser.parse_args()
    n = args.n or (50 if args.small else 500)

    with BenchEnv("reattach") as env:
        repo = make_repo(env.root / "proj", {"README": "bench\n"})
        pid = env.start_daemon()
        t = time.perf_counter()
        ids = submit_all(env, repo, n)
        submit_s = time.perf_counter() - t
        wait_until(
            f"all {n} runs RUNNING with a line",
            lambda: sum(r["phase"] == "RUNNING" and r["log_lines"] > 0 for r in runs_by_id(env).values()) == n,
            timeout_s=600,
            poll_s=1.0,
        )
        # At rest with n runs supervised.
        rest_cpu0, rest_t0 = cpu_seconds(pid), time.perf_counter()
        time.sleep(10)
        rest_cpu_pct = 100 * (cpu_seconds(pid) - rest_cpu0) / (time.perf_counter() - rest_t0)
        rest_rss = rss_bytes(pid)

        load_at_kill = load_average()
        env.kill_daemon(signal.SIGKILL)
        before = recorded_lines(env.paths.database)
        time.sleep(TICK_S + 1)

        t0 = time.perf_counter()
        daemon = env.spawn_daemon()
        with PeakRss(daemon.pid) as peak:
            health = env.wait_ready(timeout_s=600, poll_s=0.01)
            api_ready_s = time.perf_counter() - t0
            api_ready_cpu_s = cpu_seconds(daemon.pid)
            supervised = int(health.get("supervised", -1))

            def caught_up() -> bool:
                runs = runs_by_id(env)
                return all(runs[i]["log_lines"] > before.get(i, 0) for i in ids)

            wait_until("every run ingested its new lines", caught_up, timeout_s=600)
            all_reattached_s = time.perf_counter() - t0
            all_reattached_cpu_s = cpu_seconds(daemon.pid)
            rss_reattached = rss_bytes(daemon.pid)
            time.sleep(TICK_S)
            rss_after = rss_bytes(daemon.pid)
        load_after_reattach = load_average()

        t = time.perf_counter()
        cancel = subprocess.run(env.cli_argv("cancel", *ids), env=env.env, cwd=env.root, capture_output=True, text=True)
        cancel_s = time.perf_counter() - t
        if cancel.returncode != 0:
            raise RuntimeError(f"jobsup cancel exited {cancel.returncode}: {cancel.stderr.strip()[-2000:]}")
        runs = runs_by_id(env)
        not_canceled = [i for i in ids if runs[i]["phase"] != "CANCELED"]
        leftovers = env.leftovers()
        if not_canceled or leftovers:
            raise RuntimeError(f"after cancel: not CANCELED {not_canceled[:10]}, still alive {leftovers[:10]}")

    mb = 2**20
    figures = [
        Figure("runs", n, "runs"),
        Figure("submit_all_s", submit_s, "s"),
        Figure("rest_daemon_cpu_pct", rest_cpu_pct, "% core"),
        Figure("rest_daemon_rss_mb", rest_rss / mb, "MB"),
        Figure("api_ready_s", api_ready_s, "s"),
        Figure("supervised_at_ready", supervised, "runs", f"= {n}", supervised == n),
        Figure("all_reattached_s", all_reattached_s, "s"),
        Figure(
            "supervised_after_api_s",
            all_reattached_s - api_ready_s,
            "s",
            "<= 0.5",
            all_reattached_s - api_ready_s <= 0.5,
        ),
        Figure("daemon_cpu_to_api_ready_s", api_ready_cpu_s, "s"),
        Figure("daemon_cpu_api_ready_to_supervised_s", all_reattached_cpu_s - api_ready_cpu_s, "s"),
        Figure("rss_reattached_mb", rss_reattached / mb, "MB", "< 150", rss_reattached < 150 * mb),
        Figure("rss_peak_during_reattach_mb", peak.peak / mb, "MB", "< 150", peak.peak < 150 * mb),
        Figure("rss_after_mb", rss_after / mb, "MB", "< 150", rss_after < 150 * mb),
        Figure("cancel_all_s", cancel_s, "s"),
        Figure("remaining_after_cancel", len(leftovers) + len(not_canceled), "", "0", True),
    ]
    report(
        "local_reattach",
        figures,
        {
            "load_at_kill": load_at_kill,
            "load_after_reattach": load_after_reattach,
            "cores": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    main()
