"""Bench: round trip of a ``show`` tool call through a warm ``jobsup mcp``.

One private daemon and one finished local run. ``jobsup mcp`` is started
once (the real command, over stdio) and driven by the MCP SDK's own client
(``ClientSession`` over ``stdio_client``); after a warm-up, each ``show``
call is timed from just before ``call_tool`` to its validated result (the
SDK checks the structured content against the tool's output schema).

Peers measured in the same run: the same ``show`` as one ``GET
/v1/runs/{id}`` through the API client in this process (what the MCP server
does underneath; the ratio is the MCP layer's cost), and ``jobsup show RUN
-o json`` as a new CLI process each time (what an agent composing shell
commands pays).

    python bench/mcp_roundtrip.py            # N = 200 (CLI peer: 20)
    python bench/mcp_roundtrip.py --small    # N = 40 (CLI peer: 5)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from _harness import (
    BenchEnv,
    Figure,
    cpu_seconds,
    load_average,
    make_repo,
    percentile,
    report,
)

TARGET_MS = 20.0


def _mcp_pid() -> int:
    """The pid of the ``jobsup mcp`` child of this process."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        if child.cmdline()[-2:] == ["supervisord", "mcp"] or child.cmdline()[-1:] == ["mcp"]:
            return int(child.pid)
    raise RuntimeError("no jobsup mcp child process")


async def _mcp_calls(env: BenchEnv, run_id: str, n: int, warmup: int, errlog: TextIO, cpu: list[float]) -> list[float]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "supervisord", "mcp"], env=env.env, cwd=str(env.root)
    )
    lat: list[float] = []
    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        server_pid = _mcp_pid()
        cpu0 = 0.0
        for i in range(warmup + n):
            if i == warmup:
                cpu0 = cpu_seconds(server_pid)
            t0 = time.perf_counter()
            result = await session.call_tool("show", {"run": run_id})
            dt = time.perf_counter() - t0
            if not isinstance(result, types.CallToolResult) or result.is_error:
                raise RuntimeError(f"show failed: {result}")
            if i >= warmup:
                lat.append(dt)
        cpu.append((cpu_seconds(server_pid) - cpu0) / n)
    return lat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="40 calls instead of 200")
    parser.add_argument("-n", type=int, help="MCP and HTTP calls")
    args = parser.parse_args()
    n = args.n or (40 if args.small else 200)
    n_cli = 5 if args.small else 20

    with BenchEnv("mcp") as env:
        repo = make_repo(env.root / "proj", {"README": "bench\n"})
        env.start_daemon()
        with env.client() as client:
            run_id = client.submit(env.submit_body(repo, "echo hi", name="mcp"))["run"]["id"]
            for obj in client.wait([run_id], for_="terminal", timeout=60):
                if "result" in obj and not obj["result"]["met"]:
                    raise RuntimeError("the run did not end")
            load_before = load_average()
            with Path(os.devnull).open("w") as errlog:
                mcp_cpu: list[float] = []
                mcp_lat = anyio.run(_mcp_calls, env, run_id, n, 20, errlog, mcp_cpu)
            http_lat: list[float] = []
            for i in range(20 + n):
                t0 = time.perf_counter()
                client.show(run_id)
                if i >= 20:
                    http_lat.append(time.perf_counter() - t0)
        cli_lat: list[float] = []
        for _ in range(n_cli):
            t0 = time.perf_counter()
            subprocess.run(env.cli_argv("show", run_id, "-o", "json"), env=env.env, capture_output=True, check=True)
            cli_lat.append(time.perf_counter() - t0)
        load_after = load_average()

    ms = 1000.0
    mcp_med = statistics.median(mcp_lat) * ms
    http_med = statistics.median(http_lat) * ms
    cli_med = statistics.median(cli_lat) * ms
    figures = [
        Figure("mcp_show_median_ms", mcp_med, "ms", target=f"< {TARGET_MS:.0f}", met=mcp_med < TARGET_MS),
        Figure("mcp_show_p90_ms", percentile(mcp_lat, 90) * ms, "ms"),
        Figure("mcp_server_cpu_per_call_ms", mcp_cpu[0] * ms, "ms"),
        Figure("http_show_median_ms", http_med, "ms"),
        Figure("cli_process_show_median_ms", cli_med, "ms"),
        Figure("mcp_over_http_ratio", mcp_med / http_med, "x"),
        Figure("cli_process_over_mcp_ratio", cli_med / mcp_med, "x"),
    ]
    report(
        "mcp_roundtrip",
        figures,
        {"n": n, "n_cli": n_cli, "load_before": load_before, "load_after": load_after, "cores": os.cpu_count()},
    )


if __name__ == "__main__":
    main()
