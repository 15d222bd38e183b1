"""Bench: the workstation scheduler with 1,000 queued runs and 8 GPUs.

In one process: the real event store (SQLite, ``synchronous=FULL``), the real
supervisor (gated, as in the daemon) and the real scheduler driver, with a
fake backend whose runs end when the bench says so (no processes: what is
measured is the scheduler, not process start-up). 8 + 1,000 runs asking for
1 GPU each are submitted: 8 start, 1,000 wait.

1. Release -> next admission: the bench ends one running run at a time
   (its terminal PhaseChanged frees a GPU) and measures, from the events'
   own commit times (``at``), the time to the next ``Admitted`` event.
   Median and p99 over ``--releases`` releases (aim: p99 < 50 ms).
   Peer, measured in the same run: the store's floor for "react to a commit
   with a commit" (a task waiting on ``wait_for_events`` appends a reply to
   each ping; ping ``at`` -> reply ``at``).
2. Idle CPU: the process's CPU time while 1,000 runs wait and nothing
   changes, over ``--idle-s`` seconds (aim: under 1% of a core).

    python bench/scheduler_queue.py                  # full size
    python bench/scheduler_queue.py --runs 100 --releases 20 --idle-s 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import Figure, load_average, parse_at, percentile, report

from store import EventStore, NewEvent
from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.scheduler.driver import Scheduler, SchedulerSettings
from supervisord.daemon.scheduler.gpus import Inventory
from supervisord.daemon.scheduler.policy import Gpu
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths


class FakeBackend:
    """Runs that go RUNNING at once and COMPLETED when :meth:`finish` is called."""

    name = "local"

    def __init__(self) -> None:
        self.ends: dict[str, anyio.Event] = {}
        self.running: list[str] = []

    async def preflight(self, spec: RunSpec) -> list[str]:
        return []

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        handle = {"fake": spec.run_id}
        await reporter.handle(handle)
        return handle

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        end = self.ends.setdefault(spec.run_id, anyio.Event())
        await reporter.phase("RUNNING")
        self.running.append(spec.run_id)
        await end.wait()
        await reporter.phase("COMPLETED")

    def finish(self, run_id: str) -> None:
        self.running.remove(run_id)
        self.ends[run_id].set()

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        self.ends.setdefault(spec.run_id, anyio.Event()).set()

    async def serve(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _submitted(i: int) -> dict[str, Any]:
    return {
        "project": "bench",
        "name": f"r{i}",
        "backend": "local",
        "command": "true",
        "timeout_s": 3600,
        "source": {"snapshot_sha256": "0" * 64},
        "scheduling": {"gpus": 1, "queue": "default", "priority": 0, "after": [], "after_any": [], "hold": False},
    }


async def _echo_floor(store: EventStore, n: int) -> list[float]:
    """Ping -> reply latency of a task reacting to commits (seconds)."""
    out: list[float] = []
    cursor = await store.last_seq()
    await store.append("ffff00000000", 0, [NewEvent("Submitted", {"project": "b", "name": "echo", "backend": "x"})])
    version = 1

    async def replier() -> None:
        nonlocal version
        c = cursor
        while True:
            got = await store.wait_for_events(c, run_ids=["ffff00000000"], types=["Ping"])
            c = got[-1].seq
            rec = await store.append("ffff00000000", version + 1, [NewEvent("Pong", {})])
            version = rec[-1].version

    async with anyio.create_task_group() as tg:
        tg.start_soon(replier)
        for _ in range(n):
            rec = await store.append("ffff00000000", version, [NewEvent("Ping", {})])
            version = rec[-1].version
            pong = await store.wait_for_events(rec[-1].seq, run_ids=["ffff00000000"], types=["Pong"], timeout_s=10)
            out.append(parse_at(pong[0].at) - parse_at(rec[-1].at))
            await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    return out


async def main(args: argparse.Namespace) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    with tempfile.TemporaryDirectory(prefix="jb-sched-") as tmp:
        root = Path(tmp)
        paths = Paths(root / "state", root / "s.sock")
        paths.runs_dir.mkdir(parents=True)
        store = await EventStore.open(paths.database)
        backend = FakeBackend()
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": backend}, paths, tg)
            sup.gated = True
            gpus = Inventory(tuple(Gpu(i, f"GPU-{i:04d}") for i in range(args.gpus)))
            sched = Scheduler(store, sup, gpus, SchedulerSettings(caps={}))
            await sched.load()
            tg.start_soon(sched.run)
            t0 = time.monotonic()
            for i in range(args.gpus + args.runs):
                await sup.submit(_submitted(i), env={}, config={})
            submit_s = time.monotonic() - t0
            with anyio.fail_after(120):
                while len(backend.running) < args.gpus or len(sched.view()["waiting"]) < args.runs:
                    await anyio.sleep(0.05)
            # Let the pending reasons settle.
            await anyio.sleep(1.0)

            # 2. idle CPU while everything waits.
            passes0 = sched.passes
            cpu0, wall0 = time.process_time(), time.monotonic()
            await anyio.sleep(args.idle_s)
            idle_cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0) * 100
            idle_passes = sched.passes - passes0

            # 1. release -> next admission.
            lat: list[float] = []
            for _ in range(args.releases):
                victim = backend.running[0]
                after = await store.last_seq()
                backend.finish(victim)
                ended = await store.wait_for_events(after, run_ids=[victim], types=["PhaseChanged"], timeout_s=30)
                while ended and ended[-1].data.get("phase") != "COMPLETED":
                    ended = await store.wait_for_events(
                        ended[-1].seq, run_ids=[victim], types=["PhaseChanged"], timeout_s=30
                    )
                admitted = await store.wait_for_events(after, types=["Admitted"], timeout_s=30)
                assert ended and admitted, "no admission after a release"
                lat.append(parse_at(admitted[0].at) - parse_at(ended[-1].at))
                while len(backend.running) < args.gpus:
                    await anyio.sleep(0.005)
            floor = await _echo_floor(store, args.releases)
            tg.cancel_scope.cancel()
        await store.close()

    p50, p99 = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000
    f50 = percentile(floor, 50) * 1000
    report(
        "scheduler_queue",
        [
            Figure("release_to_admission_p50_ms", p50, "ms"),
            Figure("release_to_admission_p99_ms", p99, "ms", "< 50 ms", p99 < 50),
            Figure("peer_commit_reaction_p50_ms", f50, "ms"),
            Figure("ratio_p50_to_peer", p50 / f50 if f50 else 0.0, "x"),
            Figure("idle_cpu_pct_of_core", idle_cpu, "%", "< 1 %", idle_cpu < 1.0),
            Figure("idle_passes", idle_passes, "passes"),
            Figure("submit_s", submit_s, "s"),
        ],
        {
            "runs_waiting": args.runs,
            "gpus": args.gpus,
            "releases": args.releases,
            "load_avg": load_average(),
            "cpus": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000, help="runs left waiting (default 1000)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--releases", type=int, default=200)
    ap.add_argument("--idle-s", type=float, default=10.0)
    anyio.run(main, ap.parse_args(), backend="asyncio")
