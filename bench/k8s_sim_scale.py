"""Benchmark: 500 Jobs at once on the simulated Kubernetes cluster.

Each Job's container mostly sleeps and prints a line every few seconds, like a
training job. The script creates the Jobs through the official kubernetes
client, keeps a pod watch open (as jobsup's backend would), waits until every
pod runs and then until every Job completes, and prints:

- wall time to create, to all Running, to all Complete;
- CPU seconds of the simulator's event-loop thread (API server + controllers
  + kubelet bookkeeping), of this whole process, and of the containers;
- the simulator's share of one core while the 500 containers ran.

Usage: python bench/k8s_sim_scale.py [--jobs 500] [--lines 5] [--interval 3]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client  # noqa: E402

from tests.k8s_sim import SimCluster  # noqa: E402
from tests.k8s_sim.k8s_typed import Watch  # noqa: E402
from tests.k8s_sim.manifests import job  # noqa: E402


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--lines", type=int, default=5, help="lines each container prints")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between lines")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8 * args.jobs:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8 * args.jobs)), hard))
    me = psutil.Process()
    script = f"for i in $(seq 1 {args.lines}); do echo step $i of {args.lines}; sleep {args.interval}; done"
    with tempfile.TemporaryDirectory(prefix="k8s-sim-bench-") as tmp, SimCluster.start(Path(tmp)) as sim:
        api_client = sim.api_client()
        batch: Any = client.BatchV1Api(api_client)
        core: Any = client.CoreV1Api(api_client)
        ns = sim.namespace
        running: set[str] = set()
        stop = threading.Event()
        watch_events = 0

        def watch_pods() -> None:
            nonlocal watch_events
            w = Watch()
            while not stop.is_set():
                for ev in w.stream(core.list_namespaced_pod, ns, timeout_seconds=5):
                    watch_events += 1
                    if ev["object"].status.phase == "Running":
                        running.add(ev["object"].metadata.name)
                    if stop.is_set():
                        w.stop()

        watcher = threading.Thread(target=watch_pods, daemon=True)
        watcher.start()
        cpu0_loop = sim.cpu_seconds()
        cpu0_proc = sum(me.cpu_times()[:2])
        t0 = time.monotonic()
        for i in range(args.jobs):
            batch.create_namespaced_job(ns, job(f"bench-{i:04d}", script))
        t_created = time.monotonic() - t0
        sim.wait_for(lambda: len(running) >= args.jobs, timeout=600, interval=0.5, what="every pod Running")
        t_running = time.monotonic() - t0
        cpu_loop_running = sim.cpu_seconds()
        t_mark = time.monotonic()

        def all_complete() -> bool:
            done = 0
            for j in sim.list_objects("jobs.batch"):
                if any(c["type"] == "Complete" for c in j.get("status", {}).get("conditions") or []):
                    done += 1
            return bool(done >= args.jobs)

        sim.wait_for(all_complete, timeout=600, interval=1.0, what="every Job Complete")
        t_complete = time.monotonic() - t0
        cpu_loop = sim.cpu_seconds() - cpu0_loop
        steady_loop = sim.cpu_seconds() - cpu_loop_running
        steady_wall = time.monotonic() - t_mark
        cpu_proc = sum(me.cpu_times()[:2]) - cpu0_proc
        rss_mib = me.memory_info().rss / 2**20
        children = me.cpu_times()
        stop.set()
        watcher.join(10)
        api_client.close()
    print(f"jobs                         {args.jobs}")
    print(f"container: {args.lines} lines, one every {args.interval:g}s")
    print(f"create all (s)               {t_created:.1f}")
    print(f"all pods Running (s)         {t_running:.1f}")
    print(f"all Jobs Complete (s)        {t_complete:.1f}")
    print(f"watch events seen            {watch_events}")
    print(f"simulator loop CPU (s)       {cpu_loop:.1f}")
    print(
        f"  of which while running     {steady_loop:.1f} over {steady_wall:.1f}s = {100 * steady_loop / max(steady_wall, 1e-9):.0f}% of a core"
    )
    print(f"this process CPU (s)         {cpu_proc:.1f}  (simulator + kubernetes client + watch)")
    print(f"this process RSS (MiB)       {rss_mib:.0f}")
    print(
        f"containers CPU (s)           {children.children_user + children.children_system:.1f}  (bash, sleep, unshare)"
    )


if __name__ == "__main__":
    main()
