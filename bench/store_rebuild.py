"""Bench: ``EventStore.rebuild()`` of a large event log.

Writes N events (default 1,000,000) over N/100 runs -- per run: Submitted,
two PhaseChanged, one HandleRecorded, one CancelRequested and 95 LogLines of
1..8 lines each (95% log line events) -- straight into the events table, then
times ``rebuild()`` (drop the projections, replay the whole log) and checks
the result.

    python bench/store_rebuild.py            # full size
    python bench/store_rebuild.py -n 100000  # small
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store import EventStore  # noqa: E402

AT = "2026-11-29T12:00:00.000000Z"


def run_events(rng: random.Random, run_id: str) -> Iterator[tuple[str, dict[str, object]]]:
    yield "Submitted", {"project": f"p{rng.randint(0, 9)}", "name": "train", "backend": "local"}
    yield "HandleRecorded", {"handle": {"pid": rng.randint(1, 1 << 22), "start_time": rng.random()}}
    yield "PhaseChanged", {"phase": "RUNNING"}
    offset = 0
    for i in range(95):
        lines = []
        for _ in range(rng.randint(1, 8)):
            text = f"{run_id} step {i} loss={rng.random():.6f} " + "x" * 40
            offset += len(text) + 1
            lines.append([str(offset), text])
        yield "LogLines", {"stream": rng.choice(["stdout", "stderr"]), "source": "stdout", "lines": lines}
    yield "CancelRequested", {"by": "bench"}
    yield "PhaseChanged", {"phase": "CANCELED", "reason": "Canceled", "exit_code": -15}


def write_log(path: Path, events: int) -> int:
    rng = random.Random(3)
    runs = [f"{rng.getrandbits(48):012x}" for _ in range(events // 100)]
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    # Interleave the runs, as concurrent runs would: round-robin over groups of 100.
    seq = 0
    for g in range(0, len(runs), 100):
        group = runs[g : g + 100]
        streams = [(run_id, run_events(rng, run_id)) for run_id in group]
        versions = dict.fromkeys(group, 0)
        rows = []
        while streams:
            for item in list(streams):
                run_id, gen = item
                nxt = next(gen, None)
                if nxt is None:
                    streams.remove(item)
                    continue
                seq += 1
                versions[run_id] += 1
                rows.append((seq, run_id, versions[run_id], nxt[0], AT, json.dumps(nxt[1], separators=(",", ":"))))
        conn.executemany("INSERT INTO events (seq, run_id, version, type, at, data) VALUES (?, ?, ?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    conn.close()
    return seq


async def create_schema(path: Path) -> None:
    store = await EventStore.open(path)
    await store.close()


async def rebuild(path: Path) -> tuple[float, int, int]:
    async with await EventStore.open(path) as store:
        start = time.perf_counter()
        await store.rebuild()
        elapsed = time.perf_counter() - start
        runs = await store.list_runs(phases=["CANCELED"])
        lines = sum(r.log_lines for r in runs)
    return elapsed, len(runs), lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--events", type=int, default=1_000_000, help="events in the log (default 1,000,000)")
    parser.add_argument("--dir", default=None, help="where to put the database (default: a temp dir)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp, "rebuild.db")
        anyio.run(create_schema, path)
        start = time.perf_counter()
        count = write_log(path, args.events)
        write_s = time.perf_counter() - start
        elapsed, runs, lines = anyio.run(rebuild, path)
    print(f"store rebuild: {count:,} events ({count // 100:,} runs, 95% LogLines), written in {write_s:.1f} s")
    print(f"  rebuild(): {elapsed:.2f} s, {count / elapsed:,.0f} events/s -> {runs:,} runs, {lines:,} log lines")


if __name__ == "__main__":
    main()
