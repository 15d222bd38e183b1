"""Bench: sweeps. Submitting a 1,000-run sweep through the CLI, against
single submits in the same run; the results table of that sweep; the cost
to the daemon of runs that rewrite their progress file all the time.

One private daemon (this tree's). Figures:

* ``sweep_submit_s``: wall time of ``jobsup submit --hold --sweep i=1..N
  -- echo {i}`` as a new process (one request, one transaction). Target
  < 1 s for N = 1,000.
* ``single_submit_s`` and ``singles_extrapolated_s``: the median wall time
  of one ``jobsup submit --hold`` of one run, measured M times in the same
  run (interleaved with nothing else), and that times N: the peer.
* ``runs_sweep_s``: median wall time of ``jobsup runs --sweep S -o json``
  (new process each time) over the N runs. Target < 200 ms.
* ``progress_cpu_pct``: the daemon's CPU (% of one core) while P runs each
  rewrite their progress file every 10 ms, less its CPU while P runs only
  sleep (the same supervision, no progress), each over W seconds.
  Target < 2 %.

    python bench/sweep_submit.py                 # N = 1000, M = 30, P = 100, W = 20
    python bench/sweep_submit.py --small         # N = 200, M = 10, P = 20, W = 8
    python bench/sweep_submit.py --no-progress   # skip the progress part
    python bench/sweep_submit.py --progress-runs 20   # a shared machine: 100 Python jobs take ~2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import BenchEnv, Figure, cpu_seconds, load_average, make_repo, report

WRITER = (
    "import json, os, sys, time\n"
    "path, end = os.environ['JOBSUP_PROGRESS_FILE'], time.monotonic() + float(sys.argv[1])\n"
    "write = sys.argv[2] == 'write'\n"
    "i = 0\n"
    "while time.monotonic() < end:\n"
    "    i += 1\n"
    "    if write:\n"
    "        with open(path, 'w') as f: f.write(json.dumps({'step': i, 'metrics': {'loss': 1 / i}}))\n"
    "    time.sleep(0.01)\n"
)


def _timed(env: BenchEnv, *args: str, cwd: Path) -> tuple[float, float, str, float]:
    """``(wall s, CPU s of the CLI process and the daemon meanwhile, stdout,
    the CLI's share of that CPU)`` of ``jobsup ARGS``. CPU time barely
    depends on the machine's load (the wall time on a machine shared by
    many does): both are reported, the CPU split between CLI and daemon."""
    assert env.daemon is not None
    daemon0 = cpu_seconds(env.daemon.pid)
    start = time.perf_counter()
    proc = subprocess.Popen(env.cli_argv(*args), env=env.env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read().decode() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    daemon = cpu_seconds(env.daemon.pid) - daemon0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"jobsup {' '.join(args)} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    cli = usage.ru_utime + usage.ru_stime
    return wall, cli + daemon, out, cli


def _progress_cpu(env: BenchEnv, repo: Path, runs: int, window_s: float, mode: str) -> float:
    """Daemon CPU % of one core over ``window_s`` while ``runs`` runs of
    WRITER in ``mode`` (write | sleep) are all running."""
    assert env.daemon is not None
    sweep = env.cli(
        "submit", "--sweep", f"i=1..{runs}", "--", f"{sys.executable} writer.py {window_s + 30} {mode} {{i}}", cwd=repo
    ).stdout.strip()
    deadline = time.monotonic() + 120
    while True:
        doc = json.loads(env.cli("runs", "--sweep", sweep, "-o", "json").stdout)
        if doc["counts"].get("RUNNING") == runs:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"not all {runs} runs started: {doc['counts']}")
        time.sleep(0.5)
    time.sleep(2.0)  # past the start-up of every run
    c0, t0 = cpu_seconds(env.daemon.pid), time.monotonic()
    time.sleep(window_s)
    c1, t1 = cpu_seconds(env.daemon.pid), time.monotonic()
    env.cli("cancel", sweep)
    return 100.0 * (c1 - c0) / (t1 - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--progress-runs", type=int, help="P: runs rewriting their progress file (default 100)")
    parser.add_argument("--window", type=float, help="W: seconds of each CPU measurement (default 20)")
    parser.add_argument("--runs", type=int, help="N: runs of the sweep (default 1000)")
    args = parser.parse_args()
    n, m, p, w = (200, 10, 20, 8.0) if args.small else (1000, 30, 100, 20.0)
    p = args.progress_runs or p
    w = args.window or w
    n = args.runs or n
    with BenchEnv("sweep") as env:
        # No cap on parallel runs: the progress part runs P at once.
        (env.root / "home" / ".config" / "jobsup").mkdir(parents=True)
        (env.root / "home" / ".config" / "jobsup" / "daemon.yaml").write_text("daemon:\n  max_running: 1000\n")
        env.start_daemon()
        repo = make_repo(env.root / "proj", {"writer.py": WRITER})
        env.cli("submit", "--hold", "--name", "warm-up", "--", "true", cwd=repo)  # first snapshot, imports
        sweep_s, sweep_cpu, out, sweep_cli_cpu = _timed(
            env, "submit", "--hold", "--sweep", f"i=1..{n}", "--", "echo {i}", cwd=repo
        )
        sweep = out.strip()
        time.sleep(5)  # the scheduler records why each held run waits: not the submit's cost
        singles = [
            _timed(env, "submit", "--hold", "--name", f"single-{k}", "--", f"echo {k}", cwd=repo) for k in range(m)
        ]
        single = statistics.median(s[0] for s in singles)
        single_cpu = statistics.median(s[1] for s in singles)
        single_cli_cpu = statistics.median(s[3] for s in singles)
        tables = [_timed(env, "runs", "--sweep", sweep, "-o", "json", cwd=repo) for _ in range(7)]
        table_s = statistics.median(t[0] for t in tables)
        table_cpu = statistics.median(t[1] for t in tables)
        table_cli_cpu = statistics.median(t[3] for t in tables)
        doc = json.loads(env.cli("runs", "--sweep", sweep, "-o", "json").stdout)
        assert len(doc["rows"]) == n, len(doc["rows"])
        env.cli("cancel", sweep)
        figures = [
            Figure("sweep_runs", n, "runs"),
            Figure("sweep_submit_s", sweep_s, "s", "< 1 s for 1,000 runs", sweep_s < 1.0 if n >= 1000 else None),
            Figure("sweep_submit_cpu_s", sweep_cpu, "s CPU"),
            Figure("sweep_submit_cli_cpu_s", sweep_cli_cpu, "s CPU"),
            Figure("single_submit_s", single, "s"),
            Figure("single_submit_cpu_s", single_cpu, "s CPU"),
            Figure("single_submit_cli_cpu_s", single_cli_cpu, "s CPU"),
            Figure("singles_extrapolated_s", single * n, "s"),
            Figure("runs_sweep_s", table_s, "s", "< 0.2 s", table_s < 0.2),
            Figure("runs_sweep_cpu_s", table_cpu, "s CPU"),
            Figure("runs_sweep_cli_cpu_s", table_cli_cpu, "s CPU"),
        ]
        if not args.no_progress:
            quiet = _progress_cpu(env, repo, p, w, "sleep")
            busy = _progress_cpu(env, repo, p, w, "write")
            figures += [
                Figure("progress_runs", p, "runs"),
                Figure("daemon_cpu_sleeping_pct", quiet, "% core"),
                Figure("daemon_cpu_writing_pct", busy, "% core"),
                Figure(
                    "progress_cpu_pct_per_100_runs",
                    (busy - quiet) * 100 / p,
                    "% core",
                    "< 2 % for 100 runs",
                    (busy - quiet) * 100 / p < 2.0,
                ),
            ]
        report("sweep_submit", figures, {"load_average": load_average()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
