"""Bench: a local job printing N lines as fast as it can (N = 1,000,000).

The job (``emit.py``, committed in a scratch repository) writes N lines of
79 bytes through a 64 KiB buffer, then records its start time, end time
and byte count in a marker file and exits.

jobsup: one private daemon; the job is submitted over the API. Measured:

* ``visible_after_exit_s``: from the job's end (its marker time) until line
  N is visible through the logs API. A ``GET /v1/runs/{id}/logs?follow=1
  &after_line=N-1&format=blocks`` stream (how ``jobsup logs -f`` follows)
  is open the whole time (it wakes on each of the run's events, so it adds
  almost no work); the moment it delivers line N is the moment all N lines
  are visible (lines are numbered in order);
* ``jobsup_daemon_cpu_s``: the daemon's utime + stime (``/proc/PID/stat``)
  from just before the submit until line N is visible, and scaled to
  ``_per_million_lines``; also its peak RSS, sampled every 50 ms;
* ``jobsup_runner_cpu_s``: the run's runner's utime + stime, sampled every
  10 ms until it exits (the last sample: it may miss up to 10 ms). The
  runner reads the job's stdout and stderr pipes into the output record,
  as supervisord reads its program's pipes; ``cpu_ratio_with_runner``
  compares daemon + runner with supervisord.

Supervisor (the PyPI ``supervisor`` package), in the same run: a generated
``supervisord.conf`` with the same command as a program whose stdout goes to
a log file (no rotation). supervisord starts with the program stopped; once
it is up, ``supervisorctl start`` starts it; ``supervisord_cpu_s`` is
supervisord's utime + stime from just before that until the program exited
and its log file holds every byte.

``--repeat`` rounds (default 3), each jobsup then Supervisor on fresh
daemons; every figure is the median over the rounds (CPU times come in
10 ms ticks and one round can catch a burst of other work), and the
per-round figures are printed too.

``cpu_ratio`` = jobsup daemon CPU / supervisord CPU (target: <= 3). Supervisor
keeps no durable, line-framed, queryable history, jobsup does (every line an
event in SQLite with ``synchronous=FULL``), so jobsup may spend more.

    python bench/local_log_ingest.py            # N = 1,000,000
    python bench/local_log_ingest.py --small    # N = 100,000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _harness import EMIT_PY, BenchEnv, Figure, PeakRss, cpu_seconds, load_average, make_repo, report


def _read_marker(path: Path, timeout_s: float) -> tuple[float, float, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            start, end, size = path.read_text().split()
        except FileNotFoundError:
            time.sleep(0.01)
            continue
        return float(start), float(end), int(size)
    raise RuntimeError(f"the job wrote no marker {path} within {timeout_s:g}s")


def run_jobsup(env: BenchEnv, repo: Path, n: int, profile: Path | None) -> dict[str, Any]:
    """Submit the job to a fresh daemon and measure (see the module docstring).
    With ``profile``, py-spy samples the daemon into that file (collapsed
    stacks, ``--format raw``) while the lines are ingested."""
    pid = env.start_daemon()
    marker = env.root / "jobsup.done"
    command = f"{sys.executable} emit.py {n} {marker}"
    with env.client() as client, PeakRss(pid) as rss, _py_spy(pid, profile):
        time.sleep(0.5)  # let start-up settle
        cpu0 = cpu_seconds(pid)
        run_id = client.submit(env.submit_body(repo, command, name="emit"))["run"]["id"]
        runner = _RunnerCpu(env.root / "state" / "runs" / ".status" / run_id)
        visible_at = None
        for obj in client.logs(run_id, follow=True, after_line=n - 1, format="blocks"):
            if obj.get("last_line", 0) >= n:
                visible_at = time.time()
                break
            if "end" in obj:
                raise RuntimeError(f"run {run_id} ended before line {n} was visible: {obj['end']}")
        assert visible_at is not None
        cpu_visible = cpu_seconds(pid)
        for obj in client.wait([run_id], for_="terminal", timeout=120):
            if "result" in obj and obj["result"]["runs"][0]["phase"] != "COMPLETED":
                raise RuntimeError(f"run {run_id} ended {obj['result']['runs'][0]}")
        cpu_end = cpu_seconds(pid)
        run = client.show(run_id)["run"]
        runner.join()
    start, end, size = _read_marker(marker, 10)
    if run["log_lines"] != n:
        raise RuntimeError(f"run {run_id} recorded {run['log_lines']} lines, not {n}")
    env.kill_daemon(signal.SIGTERM)
    db = env.root / "state" / "jobsup.db"
    db_bytes = sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())
    return {
        "db_bytes": db_bytes,
        "job_s": end - start,
        "bytes": size,
        "visible_after_exit_s": visible_at - end,
        "cpu_visible_s": cpu_visible - cpu0,
        "cpu_terminal_s": cpu_end - cpu0,
        "peak_rss": rss.peak,
        "runner_cpu_s": runner.cpu,
    }


class _RunnerCpu:
    """Samples the CPU seconds of the runner named in the status file at
    ``status_path`` every 10 ms, in a thread, until the runner exits."""

    def __init__(self, status_path: Path) -> None:
        self.cpu = 0.0
        self._path = status_path
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        pid = None
        while pid is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                pid = json.loads(self._path.read_bytes().split(b"\n", 1)[0]).get("runner_pid")
            time.sleep(0.005)
        while pid is not None:
            try:
                self.cpu = cpu_seconds(pid)
            except (OSError, IndexError):
                return
            time.sleep(0.01)

    def join(self) -> None:
        self._thread.join(timeout=60)


@contextlib.contextmanager
def _py_spy(pid: int, out: Path | None) -> Iterator[None]:
    """Run ``py-spy record`` on ``pid`` into ``out`` (raw collapsed stacks,
    native frames included) for the duration of the block."""
    if out is None:
        yield
        return
    spy = subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-o", str(out),
         "--format", "raw", "--rate", "200", "--native"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


SUPERVISORD_CONF = """\
[supervisord]
nodaemon=true
logfile={dir}/supervisord.log
pidfile={dir}/supervisord.pid
childlogdir={dir}
loglevel=warn

[unix_http_server]
file={sock}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{sock}

[program:emit]
command={command}
directory={repo}
autostart=false
autorestart=false
startsecs=0
stdout_logfile={dir}/emit.stdout.log
stdout_logfile_maxbytes=0
stdout_logfile_backups=0
stderr_logfile={dir}/emit.stderr.log
stderr_logfile_maxbytes=0
stderr_logfile_backups=0
environment=PYTHONUNBUFFERED="1"
"""


def run_supervisor(env: BenchEnv, repo: Path, n: int) -> dict[str, Any]:
    """The same job under Supervisor's supervisord (see the module docstring)."""
    bindir = Path(sys.executable).parent
    sup_dir = env.root / "supervisor"
    sup_dir.mkdir()
    sock = env.sock_dir / "supervisor.sock"
    marker = env.root / "supervisor.done"
    conf = sup_dir / "supervisord.conf"
    conf.write_text(
        SUPERVISORD_CONF.format(dir=sup_dir, sock=sock, repo=repo, command=f"{sys.executable} emit.py {n} {marker}")
    )
    ctl = [str(bindir / "supervisorctl"), "-c", str(conf)]
    proc = subprocess.Popen(
        [str(bindir / "supervisord"), "-c", str(conf)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=(sup_dir / "supervisord.out").open("wb"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([*ctl, "pid"], capture_output=True, text=True).stdout.strip() != str(proc.pid):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"supervisord did not start: {(sup_dir / 'supervisord.out').read_text()}")
            time.sleep(0.1)
        time.sleep(0.5)  # let start-up settle
        cpu0 = cpu_seconds(proc.pid)
        subprocess.run([*ctl, "start", "emit"], check=True, capture_output=True, timeout=60)
        start, end, size = _read_marker(marker, 600)
        log = sup_dir / "emit.stdout.log"
        deadline = time.monotonic() + 120
        while log.stat().st_size < size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{log} holds {log.stat().st_size} of {size} bytes after 120s")
            time.sleep(0.01)
        complete_at = time.time()
        cpu1 = cpu_seconds(proc.pid)
        return {"job_s": end - start, "cpu_s": cpu1 - cpu0, "complete_after_exit_s": complete_at - end}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="100,000 lines instead of 1,000,000")
    parser.add_argument("-n", type=int, help="lines")
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy the daemon while it ingests, into this file (collapsed stacks, native frames)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds, each jobsup then Supervisor on fresh daemons (median reported)"
    )
    args = parser.parse_args()
    n = args.n or (100_000 if args.small else 1_000_000)

    load_before = load_average()
    rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i in range(max(1, args.repeat)):
        with BenchEnv("ingest") as env:
            repo = make_repo(env.root / "proj", {"emit.py": EMIT_PY})
            rounds.append((run_jobsup(env, repo, n, args.profile if i == 0 else None), run_supervisor(env, repo, n)))
    load_after = load_average()
    # Each figure is the median over the rounds; the ratio is that of the
    # two medians (CPU times are read in 10 ms ticks, and one round on a
    # shared machine can catch a burst of other work on either side).
    js = {key: statistics.median(r[0][key] for r in rounds) for key in rounds[0][0]}
    sup = {key: statistics.median(r[1][key] for r in rounds) for key in rounds[0][1]}
    round_ratios = [round(j["cpu_visible_s"] / s["cpu_s"], 2) if s["cpu_s"] > 0 else None for j, s in rounds]

    per_m = 1_000_000 / n
    ratio = js["cpu_visible_s"] / sup["cpu_s"] if sup["cpu_s"] > 0 else float("inf")
    figures = [
        Figure("lines", n, "lines"),
        Figure("visible_after_exit_s", js["visible_after_exit_s"], "s"),
        Figure("jobsup_job_s", js["job_s"], "s"),
        Figure("jobsup_daemon_cpu_s", js["cpu_visible_s"], "s"),
        Figure("jobsup_daemon_cpu_s_per_million_lines", js["cpu_visible_s"] * per_m, "s"),
        Figure("jobsup_daemon_cpu_s_incl_completion", js["cpu_terminal_s"], "s"),
        Figure("jobsup_daemon_peak_rss_mb", js["peak_rss"] / 2**20, "MB"),
        Figure("jobsup_runner_cpu_s", js["runner_cpu_s"], "s"),
        Figure(
            "db_bytes_per_log_byte", js["db_bytes"] / js["bytes"], "x", "<= 1.3", js["db_bytes"] / js["bytes"] <= 1.3
        ),
        Figure("supervisor_job_s", sup["job_s"], "s"),
        Figure("supervisor_log_complete_after_exit_s", sup["complete_after_exit_s"], "s"),
        Figure("supervisord_cpu_s", sup["cpu_s"], "s"),
        Figure("supervisord_cpu_s_per_million_lines", sup["cpu_s"] * per_m, "s"),
        Figure("cpu_ratio", ratio, "x", "<= 3", ratio <= 3),
        Figure(
            "cpu_ratio_with_runner",
            (js["cpu_visible_s"] + js["runner_cpu_s"]) / sup["cpu_s"] if sup["cpu_s"] > 0 else float("inf"),
            "x",
        ),
    ]
    report(
        "local_log_ingest",
        figures,
        {
            "bytes": js["bytes"],
            "rounds": len(rounds),
            "cpu_ratio_per_round": round_ratios,
            "jobsup_daemon_cpu_s_per_round": [r[0]["cpu_visible_s"] for r in rounds],
            "supervisord_cpu_s_per_round": [r[1]["cpu_s"] for r in rounds],
            "load_before": load_before,
            "load_after": load_after,
            "cores": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    main()
