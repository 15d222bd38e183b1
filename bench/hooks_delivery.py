"""Bench: hook delivery.

1. Latency, from a run's terminal event to the webhook's arrival at a local
   HTTP server, with 100 runs ending at once: an event store on a real
   SQLite file (``synchronous=FULL``), the daemon's own :class:`HookService`
   with one webhook hook, and 100 terminal ``PhaseChanged`` appends issued
   concurrently. Each latency runs from the moment its append returned
   (its COMMIT was durable) to the moment the server had read the request.
   Peer, measured in the same round: a bare store subscriber
   (``wait_for_events``) on the same events, i.e. the floor any subscriber
   pays before doing anything; the ratio is hooks / bare subscription.
   (aim: p99 under 100 ms). The webhook server runs in its own process
   (``--receiver thread``: in threads of the bench's process, as before,
   where it competes with the daemon code for the interpreter lock). Measured
   twice: with the default ``webhook.in_flight`` 1 (one delivery at a time,
   strictly in order) and with ``--in-flight`` N (default 8). ``--rounds``
   rounds (default 5) of ``--runs`` runs each, pooled: on a shared machine
   one round's p99 is its slowest delivery, at the mercy of one burst of
   other load; the p99 of each round is printed too, and (medians over the
   rounds, in_flight 1) the first delivery's latency and the time each
   further delivery adds.
2. Idle CPU: the real daemon with 10 hooks configured (5 command hooks, 5
   webhooks) and nothing happening, against the same daemon with no hooks,
   each measured over ``--idle-s`` seconds after start-up settled (aim:
   nothing measurable over idle: hooks wake on commits, they do not poll).
3. Peer for 1.: the same deliveries with httpx as the webhook client (the
   client the daemon uses where an environment proxy applies), in the same
   rounds, alternating with the lean h11 client (``--no-httpx`` skips it).

    python bench/hooks_delivery.py                 # 100 runs, 30 s idle
    python bench/hooks_delivery.py --runs 20 --idle-s 5
"""

from __future__ import annotations

import argparse
import bisect
import http.server
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    BenchEnv,
    Figure,
    cpu_seconds,
    load_average,
    percentile,
    report,
)

from store import EventStore, NewEvent
from supervisord.daemon.hooks import delivery
from supervisord.daemon.hooks.delivery import HookService
from supervisord.shared.hooksconfig import HookSpec, WebhookTarget

_PROXIED = delivery.proxied


class Receiver:
    """A threaded local HTTP server noting when each X-Jobsup-Event arrived."""

    def __init__(self) -> None:
        self.arrived: dict[int, int] = {}  # seq -> time.monotonic_ns()
        self.cond = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.monotonic_ns()
                with receiver.cond:
                    receiver.arrived.setdefault(int(self.headers["X-Jobsup-Event"]), now)
                    receiver.cond.notify_all()
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def wait(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.arrived) < n:
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"only {len(self.arrived)} of {n} webhooks arrived")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_receiver() -> None:
    """``--serve-receiver``: a :class:`Receiver` in its own process. Prints
    its URL; then reads ``N`` lines from stdin: waits until N webhooks
    arrived (at most 120 s) and prints ``{seq: monotonic_ns}`` as JSON
    (CLOCK_MONOTONIC is one clock for every process of the machine)."""
    receiver = Receiver()
    print(receiver.url, flush=True)
    for line in sys.stdin:
        receiver.wait(int(line), 120.0)
        with receiver.cond:
            print(json.dumps(receiver.arrived), flush=True)


class ProcessReceiver:
    """A :class:`Receiver` in a child process (``--serve-receiver``), so the
    webhook server does not share the daemon's interpreter lock: a webhook
    receiver is never in the daemon's process. Same ``url``, ``wait`` and
    ``arrived`` (filled by ``wait``)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-receiver"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.url = self.proc.stdout.readline().strip()
        self.arrived: dict[int, int] = {}

    def wait(self, n: int, timeout_s: float) -> None:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the receiver process ended before {n} webhooks arrived")
        self.arrived = {int(k): int(v) for k, v in json.loads(line).items()}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


async def latency(
    runs: int, in_process: bool = False, in_flight: int = 1, client: str = "h11"
) -> tuple[list[float], list[float]]:
    """(hook arrival latencies, bare-subscriber latencies), ms. The webhook
    server runs in a child process unless ``in_process`` (then in threads of
    this process, sharing its interpreter lock); the hook has
    ``webhook.in_flight`` = ``in_flight`` (1: the default). ``client``:
    ``h11`` (the daemon's lean client, supervisord.daemon.hooks.http1) or ``httpx``
    (what the daemon uses where a proxy applies: every URL is treated so)."""
    delivery.proxied = (lambda url: True) if client == "httpx" else _PROXIED
    receiver: Receiver | ProcessReceiver = Receiver() if in_process else ProcessReceiver()
    folder = Path(tempfile.mkdtemp(prefix="jobsup-bench-hooks-"))
    try:
        async with await EventStore.open(folder / "jobsup.db", synchronous="FULL") as store:
            ids = [f"{i:012x}" for i in range(runs)]
            for run_id in ids:
                await store.append(
                    run_id, 0, [NewEvent("Submitted", {"project": "bench", "name": "n", "backend": "local"})]
                )
            hook = HookSpec(
                name="bench", when=frozenset({"COMPLETED"}), webhook=WebhookTarget(receiver.url, in_flight=in_flight)
            )
            service = HookService(store, [hook], env={})
            seen: dict[int, int] = {}
            start_seq = await store.last_seq()

            async def subscriber() -> None:
                cursor = start_seq
                while len(seen) < runs:
                    for e in await store.wait_for_events(cursor, types=["PhaseChanged"]):
                        seen.setdefault(e.seq, time.monotonic_ns())
                        cursor = e.seq

            async def finish(run_id: str) -> None:
                await store.append(run_id, 1, [NewEvent("PhaseChanged", {"phase": "COMPLETED", "exit_code": 0})])

            async with anyio.create_task_group() as tg:
                tg.start_soon(service.run)
                with anyio.fail_after(30):
                    while "hook:bench" not in await store.checkpoints():
                        await anyio.sleep(0.01)
                tg.start_soon(subscriber)
                await anyio.sleep(0.2)
                async with anyio.create_task_group() as ends:
                    for run_id in ids:
                        ends.start_soon(finish, run_id)
                await anyio.to_thread.run_sync(receiver.wait, runs, 120.0)
                tg.cancel_scope.cancel()
            # When each terminal event's COMMIT returned: the writer notes
            # (last seq of the batch, time.monotonic_ns()) of every commit.
            commits = sorted(store._writer.commit_times)
            last_seqs = [seq for seq, _ in commits]

            def committed(seq: int) -> int:
                return commits[bisect.bisect_left(last_seqs, seq)][1]

            hooks = [(ns - committed(seq)) / 1e6 for seq, ns in receiver.arrived.items()]
            bare = [(ns - committed(seq)) / 1e6 for seq, ns in seen.items()]
            return hooks, bare
    finally:
        receiver.close()


def idle_cpu(hooks: int, idle_s: float, url: str) -> float:
    """CPU seconds the daemon used over ``idle_s`` with ``hooks`` hooks."""
    with BenchEnv("hooks-idle") as env:
        folder = env.root / "home" / ".config" / "jobsup"
        folder.mkdir(parents=True)
        items = []
        for i in range(hooks):
            if i % 2:
                items.append({"name": f"w{i}", "webhook": {"url": url}})
            else:
                items.append({"name": f"c{i}", "command": ["true"]})
        (folder / "config.yaml").write_text(json.dumps({"hooks": items}))
        pid = env.start_daemon()
        time.sleep(3.0)  # start-up settles (imports, first checkpoints)
        before = cpu_seconds(pid)
        time.sleep(idle_s)
        return cpu_seconds(pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="latency rounds of --runs runs each, pooled (default 5)")
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument(
        "--receiver",
        choices=["process", "thread"],
        default="process",
        help="the webhook server in a child process (default) or in threads of the bench's process",
    )
    parser.add_argument(
        "--in-flight", type=int, default=8, help="also measure a hook with this webhook.in_flight (default 8)"
    )
    parser.add_argument(
        "--no-httpx", action="store_true", help="skip the peer: the same deliveries with httpx as the client"
    )
    parser.add_argument("--serve-receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_receiver:
        serve_receiver()
        return
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    load_before = load_average()
    hooks_ms: list[float] = []
    bare_ms: list[float] = []
    window_ms: list[float] = []
    round_p99s: list[float] = []
    # Per round, with in_flight 1 (one delivery after the other): the first
    # delivery's latency, and the time each further one adds (last minus
    # first, over runs - 1): p99 is about the first plus 99 of those.
    firsts: list[float] = []
    each: list[float] = []
    # Peer: the same deliveries with httpx as the webhook client.
    httpx_ms: list[float] = []
    httpx_window_ms: list[float] = []
    httpx_round_p99s: list[float] = []
    for _ in range(args.rounds):  # alternating, so that a burst of load hits both alike
        hooks, bare = anyio.run(latency, args.runs, args.receiver == "thread", backend="asyncio")
        window, _ = anyio.run(latency, args.runs, args.receiver == "thread", args.in_flight, backend="asyncio")
        if not args.no_httpx:
            peer, _ = anyio.run(latency, args.runs, args.receiver == "thread", 1, "httpx", backend="asyncio")
            peer_window, _ = anyio.run(
                latency, args.runs, args.receiver == "thread", args.in_flight, "httpx", backend="asyncio"
            )
            httpx_ms += peer
            httpx_window_ms += peer_window
            httpx_round_p99s.append(round(percentile(peer, 99), 1))
        hooks_ms += hooks
        bare_ms += bare
        window_ms += window
        round_p99s.append(round(percentile(hooks, 99), 1))
        firsts.append(min(hooks))
        each.append((max(hooks) - min(hooks)) / max(1, len(hooks) - 1))
    receiver = Receiver()
    try:
        idle_hooks = idle_cpu(10, args.idle_s, receiver.url)
        idle_none = idle_cpu(0, args.idle_s, receiver.url)
    finally:
        receiver.close()
    p50, p99 = statistics.median(hooks_ms), percentile(hooks_ms, 99)
    bare50, bare99 = statistics.median(bare_ms), percentile(bare_ms, 99)
    peer_figures = []
    if httpx_ms:
        peer_figures = [
            Figure("httpx_webhook_p50_ms", statistics.median(httpx_ms), "ms"),
            Figure("httpx_webhook_p99_ms", percentile(httpx_ms, 99), "ms", "< 100 ms", percentile(httpx_ms, 99) < 100),
            Figure(f"httpx_webhook_in_flight_{args.in_flight}_p50_ms", statistics.median(httpx_window_ms), "ms"),
            Figure(f"httpx_webhook_in_flight_{args.in_flight}_p99_ms", percentile(httpx_window_ms, 99), "ms"),
            Figure("p99_ratio_httpx_vs_h11", percentile(httpx_ms, 99) / p99 if p99 else float("inf"), "x"),
        ]
    report(
        "hooks_delivery",
        [
            Figure("webhook_p50_ms", p50, "ms"),
            Figure("webhook_p99_ms", p99, "ms", "< 100 ms", p99 < 100),
            Figure("webhook_max_ms", max(hooks_ms), "ms"),
            Figure("webhook_first_delivery_ms", statistics.median(firsts), "ms"),
            Figure("webhook_each_further_delivery_ms", statistics.median(each), "ms"),
            Figure(f"webhook_in_flight_{args.in_flight}_p50_ms", statistics.median(window_ms), "ms"),
            Figure(f"webhook_in_flight_{args.in_flight}_p99_ms", percentile(window_ms, 99), "ms"),
            Figure("bare_subscriber_p50_ms", bare50, "ms"),
            Figure("bare_subscriber_p99_ms", bare99, "ms"),
            Figure("p99_ratio_vs_bare_subscriber", p99 / bare99 if bare99 else float("inf"), "x"),
            Figure("idle_cpu_10_hooks_s", idle_hooks, "s"),
            Figure("idle_cpu_no_hooks_s", idle_none, "s"),
            Figure("idle_cpu_extra_pct", (idle_hooks - idle_none) / args.idle_s * 100, "% of a core", "~0", None),
            *peer_figures,
        ],
        {
            "runs": args.runs,
            "rounds": args.rounds,
            "webhook_p99_per_round_ms": round_p99s,
            "httpx_webhook_p99_per_round_ms": httpx_round_p99s,
            "idle_s": args.idle_s,
            "receiver": args.receiver,
            "loadavg_before": load_before,
            "loadavg_after": load_average(),
        },
    )


if __name__ == "__main__":
    main()
