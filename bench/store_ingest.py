"""Bench: durable ingest of log lines into the event store.

N log lines of ~100 bytes arrive in bursts (1..200 lines, mean ~100) from 50
concurrent producers, each appending ``LogLines`` events to its own run with
optimistic concurrency, under ``synchronous=FULL``. Prints the store's rate,
the rate of raw ``sqlite3`` ``executemany`` of the same rows in 1,000-row
transactions (same machine, same run), their ratio, the number of
transactions, and the resident memory growth during the ingest.

Targets (2-core machine, N = 1,000,000): >= 100,000 lines/s, ratio >= 0.25,
RSS growth < 50 MB.

    python bench/store_ingest.py            # full size
    python bench/store_ingest.py -n 50000   # small
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from typing import Self

from store import EventStore, NewEvent  # noqa: E402

FILLER = "x" * 120


def bursts(producer: int, total: int, seed: int) -> Iterator[list[tuple[str, str]]]:
    """``total`` lines for one producer, in bursts of 1..200 ``(pos, text)``."""
    rng = random.Random(seed)
    n, offset = 0, 0
    while n < total:
        size = min(rng.randint(1, 200), total - n)
        burst = []
        for _ in range(size):
            text = f"producer {producer:02d} line {n:09d} {FILLER}"[:100]
            offset += len(text) + 1
            burst.append((str(offset), text))
            n += 1
        yield burst


class RssSampler:
    """Samples this process's RSS every 20 ms in a thread; ``peak`` in bytes."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.baseline = self._proc.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


async def ingest(path: Path, lines: int, producers: int, synchronous: str) -> tuple[float, int, float]:
    store = await EventStore.open(path, synchronous=synchronous)  # type: ignore[arg-type]
    per = lines // producers
    async with store:

        async def produce(i: int) -> None:
            run_id = f"{i:012x}"
            recorded = await store.append(
                run_id, 0, [NewEvent("Submitted", {"project": "bench", "name": f"p{i}", "backend": "local"})]
            )
            version = recorded[-1].version
            for burst in bursts(i, per, seed=i):
                event = NewEvent("LogLines", {"stream": "stdout", "source": "stdout", "lines": burst})
                version = (await store.append(run_id, version, [event]))[-1].version

        with RssSampler() as rss:
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(producers):
                    tg.start_soon(produce, i)
            elapsed = time.perf_counter() - start
        stored = sum(r.log_lines for r in await store.list_runs(project="bench"))
        transactions = store._writer.transactions
    assert stored == per * producers, (stored, per * producers)
    return elapsed, transactions, (rss.peak - rss.baseline) / 2**20


def raw_sqlite(path: Path, lines: int, producers: int, synchronous: str) -> float:
    """The same rows through plain sqlite3 executemany, 1,000 per transaction."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("CREATE TABLE log_lines (run_id TEXT, line_no INTEGER, stream TEXT, source TEXT, pos TEXT, text TEXT)")
    per = lines // producers

    def rows() -> Iterator[tuple[str, int, str, str, str, str]]:
        gens = [(f"{i:012x}", bursts(i, per, seed=i)) for i in range(producers)]
        counters = [0] * producers
        while gens:
            for j, (run_id, gen) in enumerate(list(gens)):
                burst = next(gen, None)
                if burst is None:
                    gens.remove((run_id, gen))
                    continue
                for pos, text in burst:
                    counters[j] += 1
                    yield (run_id, counters[j], "stdout", "stdout", pos, text)

    start = time.perf_counter()
    it = rows()
    while True:
        chunk = [row for _, row in zip(range(1000), it)]
        if not chunk:
            break
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO log_lines VALUES (?, ?, ?, ?, ?, ?)", chunk)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--lines", type=int, default=1_000_000, help="log lines to ingest (default 1,000,000)")
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"])
    parser.add_argument("--dir", default=None, help="where to put the databases (default: a temp dir)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        lines = args.lines // args.producers * args.producers
        elapsed, transactions, rss_mb = anyio.run(
            ingest, Path(tmp, "store.db"), lines, args.producers, args.synchronous
        )
        size = sum(p.stat().st_size for p in Path(tmp).glob("store.db*"))
        raw = raw_sqlite(Path(tmp, "raw.db"), lines, args.producers, args.synchronous)
    rate, raw_rate = lines / elapsed, lines / raw
    print(f"store ingest: {lines:,} lines from {args.producers} producers, synchronous={args.synchronous}")
    print(f"  store:      {elapsed:8.2f} s  {rate:12,.0f} lines/s  ({transactions:,} transactions)")
    print(f"  raw sqlite: {raw:8.2f} s  {raw_rate:12,.0f} lines/s  (executemany, 1,000-row transactions)")
    print(f"  ratio store/raw: {rate / raw_rate:.2f}   (aim >= 0.25)")
    print(f"  RSS growth during ingest: {rss_mb:.1f} MB   (aim < 50 MB)")
    print(f"  database size: {size / 2**20:.0f} MB   target lines/s >= 100,000: {'yes' if rate >= 100_000 else 'NO'}")


if __name__ == "__main__":
    main()
