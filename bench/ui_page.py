"""The web page's limits (issue "A web page for runs", Limits).

Measures, against a real daemon serving the page:

- a run page's load time (the HTML with the last 1,000 lines) for a run of
  ``--lines`` lines (default 10,000,000), median of 10 requests; aim < 1 s;
- the runs list's first page, median of 10 (paging on the server with
  10,000 runs is checked by tests/supervisord/ui/test_ui_http.py);
- requests an idle open page makes: an open SSE stream for 30 s counts as
  one request (heartbeats are comments on it); aim <= 1 request/s.

Prints a table, then one JSON line. Usage:
``python bench/ui_page.py [--lines N] [--quick]``
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import BenchEnv, Figure, load_average, make_repo, report


def _median_ms(client: httpx.Client, path: str, n: int = 10) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        resp = client.get(path)
        resp.raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=10_000_000)
    ap.add_argument("--quick", action="store_true", help="100,000 lines")
    args = ap.parse_args()
    if args.quick:
        args.lines = 100_000
    with BenchEnv("ui") as env:
        env.start_daemon()
        repo = make_repo(env.root / "repo", {"noop.sh": "true\n"})
        big = env.cli("submit", "--", "seq", "1", str(args.lines), cwd=repo).stdout.strip()
        t0 = time.perf_counter()
        env.cli("wait", big, "--timeout", "2h")
        # Wait until every line is visible.
        client = env.client()
        while client.show(big)["run"]["log_lines"] < args.lines:
            time.sleep(0.5)
        ingest_s = time.perf_counter() - t0
        url = env.cli("ui", "--no-open").stdout.strip()
        base = url.split("/?")[0]
        http = httpx.Client(base_url=base, timeout=60)
        http.get(url)  # the token for the cookie
        run_ms = _median_ms(http, f"/runs/{big}")
        page = http.get(f"/runs/{big}").text
        shown = len(re.findall(r'class="ln ', page))
        list_ms = _median_ms(http, "/")
        # Idle stream: one request held open, heartbeats only.
        requests = 0
        t1 = time.perf_counter()
        with http.stream("GET", f"/runs/{big}/stream", timeout=httpx.Timeout(40.0)) as resp:
            requests += 1
            for _chunk in resp.iter_bytes():
                if time.perf_counter() - t1 > 30:
                    break
        idle_rate = requests / (time.perf_counter() - t1)
        report(
            "ui_page",
            [
                Figure("run page, last 1,000 of lines", run_ms, "ms", "< 1000", run_ms < 1000),
                Figure("lines in that page", shown, "lines", "1000"),
                Figure("runs list, first page", list_ms, "ms"),
                Figure("idle page requests", idle_rate, "req/s", "<= 1", idle_rate <= 1),
                Figure("ingest of the big run", ingest_s, "s"),
            ],
            {"lines": args.lines, "load": load_average()},
        )


if __name__ == "__main__":
    main()
