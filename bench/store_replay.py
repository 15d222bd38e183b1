"""Bench: replay of one run's stored log lines (what ``jobsup logs RUN`` does).

Stores N log lines (~100 bytes) of one run, then reads them all back through
``EventStore.log_lines`` in pages of 10,000 and prints the rate (aim, for
N = 1,000,000: >= 300,000 lines/s).

    python bench/store_replay.py            # full size
    python bench/store_replay.py -n 100000  # small
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store import EventStore, NewEvent  # noqa: E402

RUN = "0123456789ab"


async def fill(path: Path, lines: int) -> None:
    async with await EventStore.open(path, synchronous="OFF") as store:
        version = (await store.append(RUN, 0, [NewEvent("Submitted", {
            "project": "bench", "name": "replay", "backend": "local"})]))[-1].version  # fmt: skip
        offset = 0
        for start in range(0, lines, 5000):
            burst = []
            for n in range(start, min(lines, start + 5000)):
                text = f"line {n:09d} " + "x" * 85
                offset += len(text) + 1
                burst.append([str(offset), text])
            event = NewEvent("LogLines", {"stream": "stdout", "source": "stdout", "lines": burst})
            version = (await store.append(RUN, version, [event]))[-1].version


async def replay(path: Path) -> tuple[int, float]:
    async with await EventStore.open(path) as store:
        start = time.perf_counter()
        count, after, chars = 0, 0, 0
        while page := await store.log_lines(RUN, after_line=after, limit=10_000):
            count += len(page)
            chars += sum(len(line.text) for line in page)
            after = page[-1].line_no
        return count, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--lines", type=int, default=1_000_000, help="stored lines (default 1,000,000)")
    parser.add_argument("--dir", default=None, help="where to put the database (default: a temp dir)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp, "replay.db")
        start = time.perf_counter()
        anyio.run(fill, path, args.lines)
        fill_s = time.perf_counter() - start
        count, elapsed = anyio.run(replay, path)
    assert count == args.lines, (count, args.lines)
    print(f"store replay: {count:,} stored lines of one run (stored in {fill_s:.1f} s)")
    print(f"  log_lines pages of 10,000: {elapsed:.2f} s, {count / elapsed:,.0f} lines/s   (aim >= 300,000)")


if __name__ == "__main__":
    main()
