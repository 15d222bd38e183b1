"""Bench: ``jobsup logs RUN`` replaying N stored lines (N = 1,000,000).

Set-up (not timed): one private daemon; a local job (``emit.py``) prints N
lines of 79 bytes; the bench waits until the run is COMPLETED with all N
lines recorded.

Timed, ``--repeat`` times (default 3; the median is reported): the real CLI,
``python -m supervisord logs RUN`` as a new process, its stdout a pipe the
bench reads in 64 KiB chunks, counting newlines:

* ``first_line_s``: from spawning the CLI until the first complete line
  arrives on the pipe (includes the CLI's Python start-up and the daemon's
  first page of lines);
* ``lines_per_s``: N / (spawn until EOF and exit), and the streaming rate
  alone, N / (first line until EOF);
* the CPU seconds of the CLI process (``wait4`` rusage) and of the daemon
  (``/proc/PID/stat``) per replay, to show which side bounds the rate.

    python bench/local_logs_replay.py            # N = 1,000,000
    python bench/local_logs_replay.py --small    # N = 100,000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _harness import EMIT_PY, BenchEnv, Figure, cpu_seconds, load_average, make_repo, report


def replay(env: BenchEnv, run_id: str, daemon_pid: int, n: int) -> dict[str, float]:
    """One ``jobsup logs RUN`` through a pipe; the figures of the module docstring."""
    cpu0 = cpu_seconds(daemon_pid)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        env.cli_argv("logs", run_id), env=env.env, cwd=env.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    first: float | None = None
    lines = 0
    fd = proc.stdout.fileno()
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        newlines = chunk.count(b"\n")
        if first is None and newlines:
            first = time.perf_counter()
        lines += newlines
    _, status, usage = os.wait4(proc.pid, 0)
    end = time.perf_counter()
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.stdout.close()
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"jobsup logs exited {proc.returncode}: {stderr.strip()}")
    if lines != n or first is None:
        raise RuntimeError(f"jobsup logs printed {lines} lines, not {n}")
    return {
        "first_line_s": first - t0,
        "total_s": end - t0,
        "lines_per_s": n / (end - t0),
        "streaming_lines_per_s": n / (end - first),
        "cli_cpu_s": usage.ru_utime + usage.ru_stime,
        "daemon_cpu_s": cpu_seconds(daemon_pid) - cpu0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="100,000 lines instead of 1,000,000")
    parser.add_argument("-n", type=int, help="lines")
    parser.add_argument("--repeat", type=int, default=3, help="replays (median reported)")
    args = parser.parse_args()
    n = args.n or (100_000 if args.small else 1_000_000)

    with BenchEnv("replay") as env:
        repo = make_repo(env.root / "proj", {"emit.py": EMIT_PY})
        pid = env.start_daemon()
        marker = env.root / "emit.done"
        with env.client() as client:
            run_id = client.submit(env.submit_body(repo, f"{sys.executable} emit.py {n} {marker}", name="emit"))["run"][
                "id"
            ]
            result: dict[str, Any] = {}
            for obj in client.wait([run_id], for_="terminal", timeout=1800):
                result = obj.get("result") or result
            run = result["runs"][0]
            if run["phase"] != "COMPLETED" or run["log_lines"] != n:
                raise RuntimeError(f"set-up run {run_id} ended {run['phase']} with {run['log_lines']} of {n} lines")
        load_before = load_average()
        runs = [replay(env, run_id, pid, n) for _ in range(args.repeat)]
        load_after = load_average()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    figures = [
        Figure("lines", n, "lines"),
        Figure("first_line_s", med("first_line_s"), "s"),
        Figure("total_s", med("total_s"), "s"),
        Figure("lines_per_s", med("lines_per_s"), "lines/s"),
        Figure("streaming_lines_per_s", med("streaming_lines_per_s"), "lines/s"),
        Figure("cli_cpu_s", med("cli_cpu_s"), "s"),
        Figure("daemon_cpu_s", med("daemon_cpu_s"), "s"),
    ]
    report(
        "local_logs_replay",
        figures,
        {
            "repeat": args.repeat,
            "runs": [{k: round(v, 4) for k, v in r.items()} for r in runs],
            "load_before": load_before,
            "load_after": load_after,
            "cores": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    main()
