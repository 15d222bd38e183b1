"""Bench: wall time of one CLI command as a new process, against a running daemon.

What scripts and agents pay on every call. One private daemon (this tree's)
with one finished local run (1,000 log lines); then each of

* ``jobsup runs -o json``
* ``jobsup show RUN``
* ``jobsup wait RUN`` (the run is finished: the answer is immediate)
* ``jobsup logs RUN --tail 100``

runs N times as a new Python process (``python -c "from supervisord.entry
import main; main()"``, what the ``jobsup`` console script does), from just
before the spawn to the process's exit. With ``--before DIR`` (a checkout
of another revision, e.g. ``git archive main | tar -x -C DIR``) the same
commands run with that tree's CLI too (``PYTHONPATH=DIR``), interleaved
with this tree's so that both see the same machine load, and the figures
print side by side with the ratio before/after. Target: median <= 100 ms
each (``logs --tail 100``: <= 150 ms). Python itself (``python -c pass``) is measured as the floor.

Each tree's modules are byte-compiled first (``compileall``) and one
unmeasured round runs before the measured ones, as on any installed
machine: with ``PYTHONDONTWRITEBYTECODE=1`` in the environment (some CI
and sandboxes set it) Python would otherwise compile every module of the
tree from source on every call, which costs more than the whole target.

    python bench/cli_latency.py                          # N = 20
    python bench/cli_latency.py --before /tmp/jobsup-main
    python bench/cli_latency.py --small                  # N = 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import ROOT, BenchEnv, Figure, load_average, make_repo, percentile, report

ENTRY = "from supervisord.entry import main; main()"
TARGET_S = 0.100
#: Commands whose target is not :data:`TARGET_S`.
TARGETS_S = {"logs --tail 100": 0.150}


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """``(wall seconds from spawn to exit, CPU seconds user+sys)`` of
    ``argv``; raises RuntimeError when it fails. CPU time barely depends on
    the machine's load, wall time does: both are reported."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:])} exited {proc.returncode}: {err.strip()[-500:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=20, help="runs of each command (default 20)")
    parser.add_argument("--small", action="store_true", help="N = 5")
    parser.add_argument("--before", type=Path, help="another tree's root, measured side by side")
    args = parser.parse_args()
    n = 5 if args.small else args.n
    trees = {"after": ROOT}
    if args.before is not None:
        trees = {"before": args.before.resolve(), "after": ROOT}

    with BenchEnv("cli") as bench:
        bench.start_daemon()
        repo = make_repo(bench.root / "repo", {"README": "bench\n"})
        run_id = bench.cli("submit", "--backend", "local", "--name", "t", "--", "seq 1 1000", cwd=repo).stdout.strip()
        bench.cli("wait", run_id, "--timeout", "60s")
        commands = {
            "runs -o json": ["runs", "-o", "json"],
            "show RUN": ["show", run_id],
            "wait RUN": ["wait", run_id],
            "logs --tail 100": ["logs", run_id, "--tail", "100"],
        }
        samples: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        floor: list[tuple[float, float]] = []
        for tree in trees.values():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "compileall",
                    "-q",
                    str(tree / "supervisord"),
                    str(tree / "store"),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        for round_no in range(n + 1):
            warm_up = round_no == 0
            pass_figures = _timed([sys.executable, "-c", "pass"], bench.env, bench.root)
            if not warm_up:
                floor.append(pass_figures)
            for label, argv in commands.items():
                for tree_name, tree in trees.items():
                    env = {**bench.env, "PYTHONPATH": str(tree)}
                    wall, used = _timed([sys.executable, "-c", ENTRY, *argv], env, bench.root)
                    if warm_up:
                        continue
                    samples.setdefault((label, tree_name), []).append(wall)
                    cpu.setdefault((label, tree_name), []).append(used)

    figures = [
        Figure("python -c pass median", statistics.median(w for w, _ in floor) * 1000, "ms"),
        Figure("python -c pass cpu median", statistics.median(c for _, c in floor) * 1000, "ms"),
    ]
    extra: dict[str, object] = {"n": n, "load_average": load_average(), "cpus": os.cpu_count()}
    print(f"\nwall time (cpu time), {n} runs each")
    print(
        f"{'command':<16} "
        + "  ".join(f"{t + ' median':>14} {t + ' p90':>11} {t + ' cpu':>10}" for t in trees)
        + ("   before/after" if len(trees) == 2 else "")
    )
    for label in commands:
        cells = []
        medians = {}
        for tree_name in trees:
            values = samples[(label, tree_name)]
            med, p90 = statistics.median(values) * 1000, percentile(values, 90) * 1000
            cpu_med = statistics.median(cpu[(label, tree_name)]) * 1000
            medians[tree_name] = med
            cells.append(f"{med:>11.1f} ms {p90:>8.1f} ms {cpu_med:>7.1f} ms")
            target_ms = TARGETS_S.get(label, TARGET_S) * 1000
            figures.append(
                Figure(
                    f"{tree_name} {label} median",
                    med,
                    "ms",
                    target=f"<= {target_ms:.0f} ms" if tree_name == "after" else "",
                    met=(med <= target_ms) if tree_name == "after" else None,
                )
            )
            figures.append(Figure(f"{tree_name} {label} p90", p90, "ms"))
            figures.append(Figure(f"{tree_name} {label} cpu median", cpu_med, "ms"))
        ratio = f"   {medians['before'] / medians['after']:>6.2f}x" if len(trees) == 2 else ""
        print(f"{label:<16} " + "  ".join(cells) + ratio)
    report("cli_latency", figures, extra)


if __name__ == "__main__":
    main()
