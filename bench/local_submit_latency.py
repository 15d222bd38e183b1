"""Bench: submit -> RUNNING latency of a trivial local job (``true``).

One private daemon; N runs submitted one after another (each waits for the
previous one to end, so they never overlap), in two ways:

* ``cli``: from just before spawning ``jobsup submit --backend local -- true``
  (the real CLI, a new Python process each time) to the ``at`` of the run's
  ``PhaseChanged`` RUNNING event;
* ``http``: from just before the ``POST /v1/runs`` request (one in-process
  API client, connection kept open) to the same event's ``at``.

Both clocks are this machine's wall clock (``time.time()`` and the event's
UTC ``at``). For the HTTP submits it also splits the latency at the
``Submitted`` event's ``at``: request -> recorded (planning: git snapshot,
config) and recorded -> RUNNING (the local backend starting its runner,
staging, and its poll seeing the command run).

For the CLI it also times what a script waits for: spawn to exit of
``jobsup submit`` (the id printed), with the process's CPU seconds (its
rusage). The peer, task-spooler (``tsp``, when installed), is timed the same
way in the same run: ``tsp true`` N times against a private server socket.

The project's modules are compiled to bytecode first (``compileall``), as
an installed package is: with ``PYTHONDONTWRITEBYTECODE`` set and no
``__pycache__``, every CLI process would compile its imports from source.

``--profile FILE``: the daemon runs under cProfile (its main thread); the
functions of the submit path (``submit``, ``plan``, snapshot, start) are
printed by cumulative time when it stops.

Prints median and p90 of each, then one JSON line.

    python bench/local_submit_latency.py            # N = 40 of each
    python bench/local_submit_latency.py --small    # N = 8 of each
"""

from __future__ import annotations

import argparse
import compileall
import os
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from _harness import BenchEnv, Figure, load_average, make_repo, parse_at, percentile, report
from supervisord.client.api import Client


def _events(client: Client, run_id: str) -> dict[str, float]:
    """``at`` (epoch s) of the run's Submitted and PhaseChanged RUNNING events."""
    out: dict[str, float] = {}
    for event in client.events(run=run_id):
        if event.get("type") == "Submitted":
            out["submitted"] = parse_at(event["at"])
        elif event.get("type") == "PhaseChanged" and event["data"].get("phase") == "RUNNING":
            out["running"] = parse_at(event["at"])
    if "running" not in out:
        raise RuntimeError(f"run {run_id} has no PhaseChanged RUNNING event")
    return out


def _wait_terminal(client: Client, run_id: str) -> dict[str, Any]:
    for obj in client.wait([run_id], for_="terminal", timeout=60):
        if "result" in obj:
            result: dict[str, Any] = obj["result"]
            if not result["met"]:
                raise RuntimeError(f"run {run_id} did not end within 60s")
            run: dict[str, Any] = result["runs"][0]
            if run["phase"] != "COMPLETED":
                raise RuntimeError(f"run {run_id} ended {run['phase']} ({run.get('reason')}: {run.get('message')})")
            return run
    raise RuntimeError(f"wait for run {run_id} returned no result")


def _child_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def tsp_submits(n: int, root: Path) -> tuple[list[float], list[float]] | None:
    """Wall and CPU seconds of ``n`` ``tsp true`` (task-spooler) against a
    private server; None when tsp is not installed."""
    tsp = shutil.which("tsp") or shutil.which("ts")
    if tsp is None:
        return None
    env = {**os.environ, "TS_SOCKET": str(root / "tsp.sock"), "TS_MAXFINISHED": "1000", "TMPDIR": str(root)}
    walls: list[float] = []
    cpus: list[float] = []
    try:
        for _ in range(n + 1):
            cpu0, t0 = _child_cpu_s(), time.perf_counter()
            subprocess.run([tsp, "true"], env=env, capture_output=True, check=True, timeout=60)
            walls.append(time.perf_counter() - t0)
            cpus.append(_child_cpu_s() - cpu0)
    finally:
        subprocess.run([tsp, "-K"], env=env, capture_output=True, timeout=60)
    return walls[1:], cpus[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="8 submits of each kind instead of 40")
    parser.add_argument("-n", type=int, help="submits of each kind")
    parser.add_argument("--profile", type=Path, help="run the daemon under cProfile, writing this file")
    args = parser.parse_args()
    n = args.n or (8 if args.small else 40)

    root = Path(__file__).resolve().parent.parent
    for package in ("supervisord", "store"):
        compileall.compile_dir(root / package, quiet=1)
    with BenchEnv("submit") as env:
        repo = make_repo(env.root / "proj", {"README": "bench\n"})
        env.start_daemon(timeout_s=120 if args.profile else 60, profile=args.profile)
        load_before = load_average()
        tsp = tsp_submits(n, env.root)
        cli_id: list[float] = []
        cli_cpu: list[float] = []
        cli_lat: list[float] = []
        http_lat: list[float] = []
        http_record: list[float] = []
        http_to_running: list[float] = []
        with env.client() as client:
            # One warm-up run of each kind (first git snapshot, imports, page cache).
            for kind in ("cli", "http") * (n + 1):
                if kind == "cli":
                    t0 = time.time()
                    cpu0, p0 = _child_cpu_s(), time.perf_counter()
                    proc = subprocess.run(
                        env.cli_argv("submit", "--backend", "local", "--name", "lat", "--", "true"),
                        env=env.env, cwd=repo, capture_output=True, text=True, timeout=120,
                    )  # fmt: skip
                    cli_id.append(time.perf_counter() - p0)
                    cli_cpu.append(_child_cpu_s() - cpu0)
                    if proc.returncode != 0:
                        raise RuntimeError(f"jobsup submit exited {proc.returncode}: {proc.stderr.strip()}")
                    run_id = proc.stdout.strip()
                else:
                    t0 = time.time()
                    run_id = client.submit(env.submit_body(repo, "true", name="lat"))["run"]["id"]
                _wait_terminal(client, run_id)
                at = _events(client, run_id)
                if kind == "cli":
                    cli_lat.append(at["running"] - t0)
                else:
                    http_lat.append(at["running"] - t0)
                    http_record.append(at["submitted"] - t0)
                    http_to_running.append(at["running"] - at["submitted"])
        load_after = load_average()
        if args.profile and env.daemon is not None:
            env.daemon.send_signal(signal.SIGTERM)
            env.daemon.wait(120)

    cli_lat, http_lat, http_record, http_to_running = (x[1:] for x in (cli_lat, http_lat, http_record, http_to_running))
    cli_id, cli_cpu = cli_id[1:], cli_cpu[1:]
    ms = 1000.0
    figures = [
        Figure(
            "cli_submit_id_printed_median_ms",
            statistics.median(cli_id) * ms,
            "ms",
            "<= 100",
            statistics.median(cli_id) <= 0.1,
        ),
        Figure("cli_submit_id_printed_p90_ms", percentile(cli_id, 90) * ms, "ms"),
        Figure("cli_submit_cpu_median_ms", statistics.median(cli_cpu) * ms, "ms"),
        Figure("cli_submit_to_running_median_ms", statistics.median(cli_lat) * ms, "ms"),
        Figure("cli_submit_to_running_p90_ms", percentile(cli_lat, 90) * ms, "ms"),
        Figure("http_submit_to_running_median_ms", statistics.median(http_lat) * ms, "ms"),
        Figure("http_submit_to_running_p90_ms", percentile(http_lat, 90) * ms, "ms"),
        Figure("http_post_to_submitted_median_ms", statistics.median(http_record) * ms, "ms"),
        Figure("submitted_to_running_median_ms", statistics.median(http_to_running) * ms, "ms"),
        Figure("submitted_to_running_p90_ms", percentile(http_to_running, 90) * ms, "ms"),
    ]
    if tsp is not None:
        figures += [
            Figure("peer_tsp_submit_median_ms", statistics.median(tsp[0]) * ms, "ms"),
            Figure("peer_tsp_submit_p90_ms", percentile(tsp[0], 90) * ms, "ms"),
            Figure("peer_tsp_submit_cpu_median_ms", statistics.median(tsp[1]) * ms, "ms"),
        ]
    report(
        "local_submit_latency",
        figures,
        {"n": n, "load_before": load_before, "load_after": load_after, "cores": os.cpu_count()},
    )
    if args.profile:
        stats = pstats.Stats(str(args.profile)).sort_stats("cumulative")
        stats.print_stats(r"supervisord/(api/server|submit|supervisor|source|backends/local/backend)\.py", 30)


if __name__ == "__main__":
    main()
