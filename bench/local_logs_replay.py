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
  (``/proc/PID/stat``) per replay, to show which side bounds the rate;
* ``to_file_lines_per_s``: ``jobsup logs RUN > FILE`` (stdout a regular
  file), N / (spawn until exit);
* the peer, in the same run: ``cat FILE`` of the very same bytes, through
  the same pipe loop and into a file (``peer_*``), and the ratio;
* ``tail_s``: ``jobsup logs RUN --tail 100`` (spawn until exit) of a second
  run of ``--tail-lines`` lines (default 10,000,000), against ``tail -n 100
  FILE`` of its bytes; ``tail_api_s``: the same request made from the bench
  process (the daemon's share, no CLI start-up); ``tail_archived_s``: the same once that run's
  text is archived (``jobsup prune``; the first read checks the archive's
  digest, the figure is the median of the later ones).

With ``--before DIR`` (a checkout of another revision, e.g. ``git archive
main | tar -x -C DIR``) that tree's CLI (``PYTHONPATH=DIR``, against this
tree's daemon) is timed too, interleaved with this tree's so both see the
same load: ``before_first_line_s``, ``before_lines_per_s``,
``before_tail_s``. Both trees are byte-compiled first (``compileall``), as
on an installed machine: with ``PYTHONDONTWRITEBYTECODE=1`` in the
environment Python would otherwise compile every module the CLI imports
from source on each call, which costs more than the 150 ms aims.

    python bench/local_logs_replay.py            # N = 1,000,000; tail of 10,000,000
    python bench/local_logs_replay.py --small    # N = 100,000; tail of 1,000,000
    python bench/local_logs_replay.py --before /tmp/jobsup-main
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import EMIT_PY, ROOT, BenchEnv, Figure, cpu_seconds, load_average, make_repo, report


def replay(
    env: BenchEnv, run_id: str, daemon_pid: int, n: int, argv: list[str] | None = None, tree: Path | None = None
) -> dict[str, float]:
    """One ``jobsup logs RUN`` (or ``argv``, the peer; ``tree``: another
    tree's CLI) through a pipe; the figures of the module docstring."""
    cpu0 = cpu_seconds(daemon_pid)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv or env.cli_argv("logs", run_id), env=tree_env(env, tree), cwd=env.root, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
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


def tree_env(env: BenchEnv, tree: Path | None) -> dict[str, str]:
    """The environment for a CLI of ``tree`` (None: this tree's, as installed)."""
    return env.env if tree is None else {**env.env, "PYTHONPATH": str(tree)}


def timed(env: BenchEnv, argv: list[str], out: Path, tree: Path | None = None) -> float:
    """Seconds from spawning ``argv`` (stdout into the file ``out``; ``tree``:
    another tree's CLI) until it exited 0."""
    with out.open("wb") as f:
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=tree_env(env, tree), cwd=env.root, stdout=f, stderr=subprocess.PIPE,
                              check=False)  # fmt: skip
        took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}")
    return took


def api_tail(env: BenchEnv, run_id: str) -> float:
    """Seconds for ``GET /runs/{id}/logs?tail=100`` over the socket from this
    process (the daemon's part of ``--tail 100``, without the CLI's start-up)."""
    with env.client() as client:
        t0 = time.perf_counter()
        text = b"".join(client.logs_text(run_id, tail=100))
        took = time.perf_counter() - t0
    lines = text.count(b"\n")
    if lines != 100:
        raise RuntimeError(f"the API tail gave {lines} lines")
    return took


def run_emit(env: BenchEnv, repo: Path, n: int, name: str) -> str:
    """Submit the emitter for ``n`` lines and wait until they are all recorded."""
    marker = env.root / f"{name}.done"
    with env.client() as client:
        body = env.submit_body(repo, f"{sys.executable} emit.py {n} {marker}", name=name)
        run_id = str(client.submit(body)["run"]["id"])
        result: dict[str, Any] = {}
        for obj in client.wait([run_id], for_="terminal", timeout=3600):
            result = obj.get("result") or result
        run = result["runs"][0]
        if run["phase"] != "COMPLETED" or run["log_lines"] != n:
            raise RuntimeError(f"set-up run {run_id} ended {run['phase']} with {run['log_lines']} of {n} lines")
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="100,000 lines instead of 1,000,000")
    parser.add_argument("-n", type=int, help="lines")
    parser.add_argument("--repeat", type=int, default=3, help="replays (median reported)")
    parser.add_argument("--tail-lines", type=int, help="lines of the --tail run (default 10,000,000; 0: skip)")
    parser.add_argument("--before", type=Path, help="another tree's root: its CLI timed side by side")
    args = parser.parse_args()
    before: Path | None = args.before.resolve() if args.before else None
    for tree in [ROOT] + ([before] if before else []):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "supervisord"), str(tree / "store")],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    n = args.n or (100_000 if args.small else 1_000_000)
    tail_n = args.tail_lines if args.tail_lines is not None else (1_000_000 if args.small else 10_000_000)

    with BenchEnv("replay") as env:
        repo = make_repo(env.root / "proj", {"emit.py": EMIT_PY})
        pid = env.start_daemon()
        run_id = run_emit(env, repo, n, "emit")
        copy = env.root / "copy.log"
        timed(env, env.cli_argv("logs", run_id), copy)  # the peer's bytes: the same text, in a file
        load_before = load_average()
        for tree in (None, before):  # unmeasured: the page cache warm for both CLIs
            timed(env, env.cli_argv("logs", run_id, "--tail", "1"), env.root / "warm.out", tree)
        runs, peers, to_file, peer_to_file = [], [], [], []
        before_runs: list[dict[str, float]] = []
        for _ in range(args.repeat):
            if before:
                before_runs.append(replay(env, run_id, pid, n, tree=before))
            runs.append(replay(env, run_id, pid, n))
            peers.append(replay(env, run_id, pid, n, argv=["cat", str(copy)]))
            to_file.append(n / timed(env, env.cli_argv("logs", run_id), env.root / "out.log"))
            peer_to_file.append(n / timed(env, ["cat", str(copy)], env.root / "out.log"))
        tails: list[float] = []
        peer_tails: list[float] = []
        archived_tails: list[float] = []
        api_tails: list[float] = []
        archived_api_tails: list[float] = []
        before_tails: list[float] = []
        if tail_n:
            big = run_emit(env, repo, tail_n, "big")
            big_copy = env.root / "big.log"
            timed(env, env.cli_argv("logs", big), big_copy)
            for _ in range(max(3, args.repeat)):
                if before:
                    before_tails.append(
                        timed(env, env.cli_argv("logs", big, "--tail", "100"), env.root / "tail.out", before)
                    )
                tails.append(timed(env, env.cli_argv("logs", big, "--tail", "100"), env.root / "tail.out"))
                peer_tails.append(timed(env, ["tail", "-n", "100", str(big_copy)], env.root / "tail.out"))
                api_tails.append(api_tail(env, big))
            expected = subprocess.run(["tail", "-n", "100", str(big_copy)], capture_output=True, check=True).stdout
            if (env.root / "tail.out").read_bytes() != expected:
                raise RuntimeError("jobsup logs --tail 100 differs from tail -n 100")
            big_copy.unlink()
            subprocess.run(env.cli_argv("prune", "--older-than", "0s"), env=env.env, cwd=env.root, check=True,
                           capture_output=True)  # fmt: skip
            for _ in range(max(3, args.repeat) + 1):
                archived_tails.append(timed(env, env.cli_argv("logs", big, "--tail", "100"), env.root / "tail.out"))
                archived_api_tails.append(api_tail(env, big))
            if (env.root / "tail.out").read_bytes() != expected:
                raise RuntimeError("jobsup logs --tail 100 of the archived run differs from tail -n 100")
        load_after = load_average()

    def med(key: str, rows: list[dict[str, float]] | None = None) -> float:
        return statistics.median(r[key] for r in (runs if rows is None else rows))

    figures = [
        Figure("lines", n, "lines"),
        Figure("first_line_s", med("first_line_s"), "s"),
        Figure("total_s", med("total_s"), "s"),
        Figure("lines_per_s", med("lines_per_s"), "lines/s"),
        Figure("streaming_lines_per_s", med("streaming_lines_per_s"), "lines/s"),
        Figure("cli_cpu_s", med("cli_cpu_s"), "s"),
        Figure("daemon_cpu_s", med("daemon_cpu_s"), "s"),
        Figure("peer_cat_lines_per_s", med("lines_per_s", peers), "lines/s"),
        Figure("peer_cat_first_line_s", med("first_line_s", peers), "s"),
        Figure("ratio_to_cat", med("lines_per_s") / med("lines_per_s", peers), "x"),
        Figure("to_file_lines_per_s", statistics.median(to_file), "lines/s", ">= 1,000,000",
               statistics.median(to_file) >= 1_000_000),
        Figure("peer_cat_to_file_lines_per_s", statistics.median(peer_to_file), "lines/s"),
    ]  # fmt: skip
    figures[1].target, figures[1].met = "< 0.150", med("first_line_s") < 0.150
    if before_runs:
        figures += [
            Figure("before_first_line_s", med("first_line_s", before_runs), "s"),
            Figure("before_lines_per_s", med("lines_per_s", before_runs), "lines/s"),
        ]
    if tails:
        figures += [
            Figure("tail_run_lines", tail_n, "lines"),
            Figure("tail_s", statistics.median(tails), "s", "< 0.150", statistics.median(tails) < 0.150),
            Figure("peer_tail_n_s", statistics.median(peer_tails), "s"),
            Figure("tail_api_s", statistics.median(api_tails), "s"),
            Figure("tail_archived_first_s", archived_tails[0], "s"),
            Figure("tail_archived_s", statistics.median(archived_tails[1:]), "s"),
            Figure("tail_archived_api_s", statistics.median(archived_api_tails), "s"),
        ]
        if before_tails:
            figures.append(Figure("before_tail_s", statistics.median(before_tails), "s"))
    report(
        "local_logs_replay",
        figures,
        {
            "repeat": args.repeat,
            "runs": [{k: round(v, 4) for k, v in r.items()} for r in runs],
            "tails": [round(t, 4) for t in tails],
            "peer_tails": [round(t, 4) for t in peer_tails],
            "before": str(before) if before else None,
            "before_tails": [round(t, 4) for t in before_tails],
            "load_before": load_before,
            "load_after": load_after,
            "cores": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    main()
