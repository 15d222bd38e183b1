"""Bench: ``jobsup top`` renders 100 running runs in under 100 ms.

The table of a ``GET /v1/top`` document with N runs (default 100; each
with 2 GPUs, memory, a limit and progress) is built and printed with rich
to an in-memory console 120 columns wide, as the live view does on each
refresh; median and max of 30 renders. Peer in the same run: the plain
``jobsup runs``-style table of the same N rows (:func:`supervisord.client.cli.output.emit`
to a pipe), the cheapest table the CLI prints.

    python bench/top_render.py            # N = 100
    python bench/top_render.py -n 1000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time

from rich.console import Console

from _harness import Figure, load_average, report
from supervisord.client.cli.output import emit
from supervisord.client.cli.top_cmd import render_table, rows


def _doc(n: int) -> dict[str, object]:
    runs = [
        {
            "id": f"{i:012x}",
            "project": "bench",
            "name": f"train-{i}",
            "started_at": "2026-12-03T08:00:00.000000Z",
            "elapsed_s": 3600.0 + i,
            "cpu_percent": 97.5,
            "cpu_s": 3500.0 + i,
            "rss_bytes": (2 << 30) + i,
            "max_rss_bytes": 3 << 30,
            "memory_limit_bytes": 16 << 30,
            "cpus": 2.0,
            "processes": 3,
            "gpus": [i % 8, (i + 1) % 8],
            "gpu_memory_bytes": {str(i % 8): 20 << 30, str((i + 1) % 8): 18 << 30},
            "gpu_utilization": {str(i % 8): 91, str((i + 1) % 8): 88},
            "progress": {"fraction": (i % 100) / 100},
        }
        for i in range(n)
    ]
    return {"at": time.time(), "interval_s": 5.0, "runs": runs, "gpus": [], "notes": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=100)
    args = parser.parse_args()
    doc = _doc(args.n)
    times, peer = [], []
    for _ in range(30):
        t = time.perf_counter()
        console = Console(file=io.StringIO(), width=120, color_system="truecolor", force_terminal=True)
        console.print(render_table(doc))
        times.append(1000 * (time.perf_counter() - t))
    for _ in range(30):
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            emit(rows(doc), "table")
        peer.append(1000 * (time.perf_counter() - t))
    figures = [
        Figure("runs", args.n, "runs"),
        Figure("render_median_ms", statistics.median(times), "ms", "< 100", statistics.median(times) < 100),
        Figure("render_max_ms", max(times), "ms"),
        Figure("peer_plain_table_median_ms", statistics.median(peer), "ms"),
    ]
    report(f"top_render n={args.n}", figures, {"load": load_average(), "cores": os.cpu_count()})


if __name__ == "__main__":
    main()
