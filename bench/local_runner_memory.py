"""Bench: the private memory of idle local runners.

Set-up: one private daemon; N local runs submitted over the API (8 client
threads), each ``sleep 3600`` (idle). Once every run is RUNNING, each
runner's ``Private_Dirty`` and ``Rss`` are read from
``/proc/PID/smaps_rollup`` (proc(5)), the runner pid from the run's handle.

Peer, measured in the same run: a bare ``python -I -S -c "import time;
time.sleep(60)"`` of the same interpreter (the floor any Python runner
pays); the ratio runner / peer is printed. Target: every runner's
``Private_Dirty`` < 4 MB. Then every run is cancelled (the real CLI) and
the bench checks nothing is left.

    python bench/local_runner_memory.py            # N = 5, then N = 500
    python bench/local_runner_memory.py -n 50      # one size
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

from _harness import BenchEnv, Figure, load_average, make_repo, report

JOB = "sleep 3600"


def smaps_kb(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` fields in kB."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        out[key.strip()] = int(rest.split()[0])
    return out


def peer_private_kb() -> tuple[int, int]:
    """(Private_Dirty, Rss) in kB of a bare isolated interpreter, idle."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            "import sys, time; sys.stdout.write('ok\\n'); sys.stdout.flush(); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
        time.sleep(0.2)
        m = smaps_kb(proc.pid)
        return m["Private_Dirty"], m["Rss"]
    finally:
        proc.kill()
        proc.wait()


def measure(n: int) -> None:
    with BenchEnv("runner-memory") as env:
        repo = make_repo(env.root / "proj", {"README": "bench\n"})
        env.start_daemon()

        def submit(chunk: list[int]) -> list[str]:
            with env.client() as client:
                return [client.submit(env.submit_body(repo, JOB, name=f"idle-{i:04d}"))["run"]["id"] for i in chunk]

        t = time.perf_counter()
        chunks = [list(range(i, n, 8)) for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            ids = [run_id for part in pool.map(submit, chunks) for run_id in part]
        deadline = time.monotonic() + 900
        while True:
            with env.client() as client:
                runs = {r["id"]: r for r in client.runs(all=True)}
            if all(runs[i]["phase"] == "RUNNING" for i in ids):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("not all runs RUNNING within 900 s")
            time.sleep(0.5)
        start_all_s = time.perf_counter() - t
        time.sleep(1.0)  # idle
        private, rss = [], []
        for i in ids:
            pid = int(runs[i]["handle"]["runner_pid"])
            m = smaps_kb(pid)
            private.append(m["Private_Dirty"])
            rss.append(m["Rss"])
        peer_private, peer_rss = peer_private_kb()
        load = load_average()
        t = time.perf_counter()
        cancel = subprocess.run(
            env.cli_argv("cancel", *ids), env=env.env, cwd=env.root, capture_output=True, text=True, check=False
        )
        cancel_s = time.perf_counter() - t
        if cancel.returncode != 0:
            raise RuntimeError(f"jobsup cancel exited {cancel.returncode}: {cancel.stderr.strip()[-2000:]}")
        leftovers = env.leftovers()
    mean_private = sum(private) / len(private)
    figures = [
        Figure("runs", n, "runs"),
        Figure("start_all_s", start_all_s, "s"),
        Figure("runner_private_dirty_mean_mb", mean_private / 1024, "MB"),
        Figure("runner_private_dirty_max_mb", max(private) / 1024, "MB", "< 4", max(private) < 4096),
        Figure("runner_rss_mean_mb", sum(rss) / len(rss) / 1024, "MB"),
        Figure("runners_private_total_mb", sum(private) / 1024, "MB"),
        Figure("peer_bare_python_private_dirty_mb", peer_private / 1024, "MB"),
        Figure("ratio_runner_to_peer", mean_private / peer_private, "x"),
        Figure("cancel_all_s", cancel_s, "s"),
        Figure("remaining_after_cancel", len(leftovers), "", "0", not leftovers),
    ]
    report(f"local_runner_memory n={n}", figures, {"load": load, "cores": os.cpu_count(), "peer_rss_kb": peer_rss})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, action="append", help="idle runs (repeatable); default 5 and 500")
    args = parser.parse_args()
    for n in args.n or [5, 500]:
        measure(n)


if __name__ == "__main__":
    main()
