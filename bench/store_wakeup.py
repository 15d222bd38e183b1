"""Bench: subscription wake-ups of the event store.

1. Latency: 1,000 concurrent ``wait_for_events`` waiters on 100 runs (10 per
   run). 300 commits touch 1..10 runs each (10..100 waiters wake), then 30
   commits touch every run (all 1,000 waiters wake at once); each wake-up's
   latency runs from the moment its batch's COMMIT returned (recorded by the
   writer) to the moment the waiter resumed. Prints p50 / p99 / max of both
   (aim: p99 < 20 ms).
2. Race-freedom: 10,000 randomized commit/wait interleavings (100 pairs of
   one waiter and one appender, with random delays on both sides and a
   cursor that is sometimes at the head, sometimes behind); prints the
   number of missed wake-ups (must be 0).

Runs with ``synchronous=FULL``.

    python bench/store_wakeup.py                 # full size
    python bench/store_wakeup.py --scale 0.1     # small
"""

from __future__ import annotations

import argparse
import array
import bisect
import gc
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store import EventStore, NewEvent, RecordedEvent  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(path: Path, waiters: int, runs: int, rounds: int, gc_freeze: bool) -> dict[str, list[float]]:
    """Wake-up latencies (ms) of ``waiters`` waiters on ``runs`` runs, for
    ``rounds`` commits touching 1..10 runs each ("few") and ``rounds // 10``
    commits touching every run ("all": every waiter wakes at once)."""
    async with await EventStore.open(path) as store:
        run_ids = [f"{i:012x}" for i in range(runs)]
        versions = {}
        for run_id in run_ids:
            versions[run_id] = (await store.append(run_id, 0, [NewEvent("Submitted", {
                "project": "bench", "name": "wake", "backend": "local"})]))[-1].version  # fmt: skip
        start_seq = await store.last_seq()
        ready = [0]
        # first seq received, time.monotonic_ns() on resuming (arrays: nothing for the GC to scan)
        woke_seq, woke_ns = array.array("q"), array.array("q")

        async def waiter(run_id: str, stop_after: int) -> None:
            cursor, seen = start_seq, 0
            ready[0] += 1
            while seen < stop_after:
                events = await store.wait_for_events(cursor, run_ids=[run_id], timeout_s=60)
                woke_ns.append(time.monotonic_ns())
                woke_seq.append(events[0].seq if events else 0)
                cursor = events[-1].seq if events else cursor
                seen += len(events)

        rng = random.Random(1)
        plan = [("few", rng.sample(run_ids, rng.randint(1, 10))) for _ in range(rounds)]
        plan += [("all", run_ids) for _ in range(max(1, rounds // 10))]
        per_run = {run_id: sum(run_id in touched for _, touched in plan) for run_id in run_ids}
        first_seq_of: dict[str, int] = {}

        async with anyio.create_task_group() as tg:
            for i in range(waiters):
                run_id = run_ids[i % runs]
                tg.start_soon(waiter, run_id, per_run[run_id])
            while ready[0] < waiters:
                await anyio.sleep(0.01)
            await anyio.sleep(0.1)
            if gc_freeze:
                gc.freeze()  # the long-lived objects so far are never scanned again by the cyclic GC
            for phase, touched in plan:
                first_seq_of.setdefault(phase, await store.last_seq() + 1)
                async with anyio.create_task_group() as batch:  # one commit, mostly
                    for run_id in touched:

                        async def append(run_id: str = run_id) -> None:
                            versions[run_id] = (await store.append(run_id, versions[run_id], [NewEvent("Tick")]))[
                                -1
                            ].version

                        batch.start_soon(append)
                await anyio.sleep(0.05 if phase == "all" else 0.01)  # the woken waiters wait again
        commits = list(store._writer.commit_times)  # (last seq of a batch, when its COMMIT returned)
    assert all(woke_seq), "a waiter timed out"
    last_seqs = [seq for seq, _ in commits]
    latencies: dict[str, list[float]] = {"few": [], "all": []}
    for seq, resumed in zip(woke_seq, woke_ns):
        phase = "all" if seq >= first_seq_of["all"] else "few"
        latencies[phase].append((resumed - commits[bisect.bisect_left(last_seqs, seq)][1]) / 1e6)
    return latencies


async def interleavings(path: Path, pairs: int, per_pair: int) -> tuple[int, int]:
    missed = 0
    done = 0
    async with await EventStore.open(path) as store:

        async def pair(k: int) -> None:
            nonlocal missed, done
            rng = random.Random(k)
            run_id = f"pair{k:04d}"
            version = 0
            for _ in range(per_pair):
                head = await store.last_seq()
                after = max(0, head - rng.choice([0, 0, 0, 1, 5]))
                got: list[RecordedEvent] = []
                mine: list[RecordedEvent] = []
                d_wait, d_append = rng.choice([0, 0, 0.0005, 0.002]), rng.choice([0, 0, 0.0005, 0.002])

                async def wait() -> None:
                    await anyio.sleep(d_wait)
                    got.extend(await store.wait_for_events(after, run_ids=[run_id], timeout_s=5))

                async def append() -> None:
                    nonlocal version
                    await anyio.sleep(d_append)
                    mine.extend(await store.append(run_id, version, [NewEvent("Tick")]))
                    version = mine[-1].version

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    tg.start_soon(append)
                if not got:  # timed out: the commit never woke the waiter
                    missed += 1
                assert all(e.run_id == run_id and e.seq > after for e in got)
                done += 1

        async with anyio.create_task_group() as tg:
            for k in range(pairs):
                tg.start_soon(pair, k)
    return done, missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full size (default 1)")
    parser.add_argument("--dir", default=None, help="where to put the databases (default: a temp dir)")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() once the waiters are set up (what a daemon may do)"
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    waiters, runs = max(10, int(1000 * args.scale)), max(1, int(100 * args.scale))
    rounds = max(10, int(300 * args.scale))
    pairs, per_pair = max(1, int(100 * args.scale)), 100
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        latencies = anyio.run(latency, Path(tmp, "wake.db"), waiters, runs, rounds, args.gc_freeze)
        start = time.perf_counter()
        done, missed = anyio.run(interleavings, Path(tmp, "race.db"), pairs, per_pair)
        race_s = time.perf_counter() - start
    print(
        f"store wake-up: {waiters:,} waiters on {runs} runs (10 per run), synchronous=FULL"
        + (", gc.freeze() after setup" if args.gc_freeze else "")
    )
    print("  COMMIT returned -> waiter resumed (aim p99 < 20 ms):")
    for phase, title in (
        ("few", f"{rounds} commits to 1..10 runs"),
        ("all", f"{max(1, rounds // 10)} commits to every run"),
    ):
        lat = latencies[phase]
        print(
            f"    {title}: {len(lat):,} wake-ups, p50 {statistics.median(lat):.2f} ms,"
            f" p99 {percentile(lat, 0.99):.2f} ms, max {max(lat):.2f} ms"
        )
    print(f"  randomized commit/wait interleavings: {done:,} in {race_s:.1f} s, missed wake-ups: {missed}")


if __name__ == "__main__":
    main()
