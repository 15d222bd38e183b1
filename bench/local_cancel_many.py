"""Bench: one ``jobsup cancel`` of N running local runs (N = 500).

Set-up: one private daemon; N local runs submitted over the API (8 client
threads), each ``while :; do sleep 5; done``. Once every run is RUNNING,
``jobsup cancel ID...`` (the real CLI, all N ids) is timed from spawn to
exit, with the daemon's CPU seconds over the same span and the CLI's own
(its rusage). Then a check that every run is CANCELED and that no runner
and no process of any job's process group remains.

``--profile FILE``: the daemon runs under cProfile; its main thread's
profile is written to FILE when it stops (after the cancel), and the 25
functions with the most cumulative time are printed.

    python bench/local_cancel_many.py             # N = 500
    python bench/local_cancel_many.py -n 50
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pstats
import resource
import signal
import subprocess
import time
from pathlib import Path

from _harness import BenchEnv, Figure, cpu_seconds, load_average, make_repo, report

JOB = "while :; do sleep 5; done"


def submit_all(env: BenchEnv, repo: Path, n: int) -> list[str]:
    """Submit ``n`` runs from 8 threads; their ids."""

    def submit(chunk: list[int]) -> list[str]:
        with env.client() as client:
            return [client.submit(env.submit_body(repo, JOB, name=f"job-{i:04d}"))["run"]["id"] for i in chunk]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return [i for ids in pool.map(submit, [list(range(k, n, 8)) for k in range(8)]) for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=500, help="runs (default 500)")
    parser.add_argument("--profile", type=Path, help="run the daemon under cProfile, writing this file")
    args = parser.parse_args()
    n = args.n

    with BenchEnv("cancel") as env:
        repo = make_repo(env.root / "proj", {"README": "bench\n"})
        env.start_daemon(timeout_s=120 if args.profile else 60, profile=args.profile)
        assert env.daemon is not None
        pid = env.daemon.pid
        ids = submit_all(env, repo, n)
        deadline = time.monotonic() + 600
        with env.client() as client:
            while sum(r["phase"] == "RUNNING" for r in client.runs(all=True)) < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not all {n} runs RUNNING within 600 s")
                time.sleep(1.0)
        load_before = load_average()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        cancel = subprocess.run(env.cli_argv("cancel", *ids), env=env.env, cwd=env.root, capture_output=True, text=True)
        cancel_s = time.perf_counter() - t0
        daemon_cpu_s = cpu_seconds(pid) - cpu0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cli_cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        load_after = load_average()
        if cancel.returncode != 0:
            raise RuntimeError(f"jobsup cancel exited {cancel.returncode}: {cancel.stderr.strip()[-2000:]}")
        with env.client() as client:
            runs = {r["id"]: r for r in client.runs(all=True)}
        not_canceled = [i for i in ids if runs[i]["phase"] != "CANCELED"]
        leftovers = env.leftovers()
        if not_canceled or leftovers:
            raise RuntimeError(f"after cancel: not CANCELED {not_canceled[:10]}, still alive {leftovers[:10]}")
        if args.profile:
            env.daemon.send_signal(signal.SIGTERM)
            env.daemon.wait(120)

    figures = [
        Figure("runs", n, "runs"),
        Figure("cancel_s", cancel_s, "s", "<= 5", cancel_s <= 5),
        Figure("daemon_cpu_during_cancel_s", daemon_cpu_s, "s"),
        Figure("cli_cpu_s", cli_cpu_s, "s"),
        Figure("remaining_after_cancel", len(leftovers) + len(not_canceled), "", "0", True),
    ]
    report(
        "local_cancel_many",
        figures,
        {"load_before": load_before, "load_after": load_after, "cores": os.cpu_count()},
    )
    if args.profile:
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
