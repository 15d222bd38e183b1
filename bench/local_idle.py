"""Bench: the daemon's cost with N idle local runs (N = 500).

Set-up: one private daemon; N local runs submitted over the API (8 client
threads), each ``sleep 3600`` (no output, no status change). Once every run
is RUNNING, the daemon is measured at rest for ``--window`` seconds (20):

* ``idle_daemon_cpu_pct``: its CPU use (utime + stime, ``/proc/PID/stat``)
  in % of one core (target <= 1 % at 500 runs);
* ``idle_wakeups_per_s``: its threads' context switches per second
  (``voluntary_ctxt_switches`` + ``nonvoluntary_ctxt_switches`` of
  ``/proc/PID/task/*/status``): each wake-up of the event loop or of a
  worker thread is at least one.

CPU time, not wall-clock: the figures hold on a loaded machine (the load
average is reported with them).

    python bench/local_idle.py            # N = 500
    python bench/local_idle.py -n 200 --window 30
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
from pathlib import Path

from _harness import BenchEnv, Figure, cpu_seconds, load_average, make_repo, report, rss_bytes

JOB = "sleep 3600"


def context_switches(pid: int) -> int:
    """Context switches of all of ``pid``'s threads so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{task}/status").read_text()
        except OSError:
            continue  # a worker thread that just ended
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=500, help="runs (500)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured at rest (20)")
    args = parser.parse_args()
    n = args.n

    with BenchEnv("idle") as env:
        repo = make_repo(env.root / "proj", {"README": "bench\n"})
        pid = env.start_daemon()

        def submit(chunk: list[int]) -> None:
            with env.client() as client:
                for i in chunk:
                    client.submit(env.submit_body(repo, JOB, name=f"idle-{i:04d}"))

        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(submit, [list(range(i, n, 8)) for i in range(8)]))
        submit_s = time.perf_counter() - t
        deadline = time.monotonic() + 900
        while True:
            with env.client() as client:
                running = sum(r["phase"] == "RUNNING" for r in client.runs(all=True))
            if running == n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {running} of {n} runs RUNNING after 900s")
            time.sleep(1.0)
        time.sleep(3.0)  # let the last starts settle (their loops' first naps)
        load_before = load_average()
        cpu0, switches0, t0 = cpu_seconds(pid), context_switches(pid), time.perf_counter()
        time.sleep(args.window)
        elapsed = time.perf_counter() - t0
        cpu_pct = 100 * (cpu_seconds(pid) - cpu0) / elapsed
        wakeups = (context_switches(pid) - switches0) / elapsed
        load_after = load_average()
        rss = rss_bytes(pid)

    figures = [
        Figure("runs", n, "runs"),
        Figure("submit_all_s", submit_s, "s"),
        Figure("idle_daemon_cpu_pct", cpu_pct, "% core", "<= 1", cpu_pct <= 1.0),
        Figure("idle_wakeups_per_s", wakeups, "/s"),
        Figure("idle_daemon_rss_mb", rss / 2**20, "MB"),
    ]
    report(
        "local_idle",
        figures,
        {"window_s": args.window, "load_before": load_before, "load_after": load_after, "cores": os.cpu_count()},
    )


if __name__ == "__main__":
    main()
