"""``jobsup top``: the running local runs' usage, live (CPU %, RSS, GPU
memory and utilisation, elapsed, progress), from ``GET /v1/top``.

A terminal gets a table refreshed every sampling interval (at least each
second) until Ctrl-C; ``--once`` or a stdout that is not a terminal prints
one table; ``-o json|yaml`` prints one snapshot (schema ``top``).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from supervisord.client.cli.output import echo, emit, output_option
from supervisord.client.cli.reads import connected_client, elapsed_text

__all__ = ["format_elapsed", "render_table", "top"]


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{int(n)}B"


def format_elapsed(seconds: Any) -> str:
    """``42s``, ``12m05s``, ``3h07m``, ``2d04h``; ``-`` for None."""
    return elapsed_text(seconds) or "-"


def _progress(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{100 * value:.0f}%" if value <= 1 else f"{value:g}"
    if isinstance(value, dict):
        for key in ("fraction", "percent", "value"):
            if isinstance(value.get(key), (int, float)):
                return _progress(value[key]) if key != "percent" else f"{value[key]:.0f}%"
        if isinstance(value.get("text"), str):
            return str(value["text"])[:20]
    return "-" if value is None else str(value)[:20]


def rows(doc: dict[str, Any]) -> list[dict[str, str]]:
    """The table's rows (one per running run) as text cells."""
    out = []
    for r in doc.get("runs") or []:
        limit = r.get("memory_limit_bytes")
        gmem = r.get("gpu_memory_bytes") or {}
        gutil = r.get("gpu_utilization") or {}
        gpus = r.get("gpus") or []
        out.append(
            {
                "id": str(r.get("id")),
                "name": str(r.get("name") or "-"),
                "elapsed": format_elapsed(r.get("elapsed_s")),
                "cpu%": "-" if r.get("cpu_percent") is None else f"{r['cpu_percent']:.0f}",
                "rss": _bytes(r.get("rss_bytes")) + (f"/{_bytes(limit)}" if limit else ""),
                "peak": _bytes(r.get("max_rss_bytes")),
                "gpus": ",".join(str(g) for g in gpus) or "-",
                "gpu mem": " ".join(f"{k}:{_bytes(v)}" for k, v in sorted(gmem.items())) or "-",
                "gpu util": " ".join(f"{k}:{v}%" for k, v in sorted(gutil.items())) or "-",
                "progress": _progress(r.get("progress")),
            }
        )
    return out


_COLUMNS = ("id", "name", "elapsed", "cpu%", "rss", "peak", "gpus", "gpu mem", "gpu util", "progress")


_RIGHT = frozenset({"elapsed", "cpu%", "rss", "peak"})


def render_table(doc: dict[str, Any]) -> Any:
    """What the live view prints for ``doc`` (a ``GET /v1/top`` document):
    a rich Text of aligned columns, the header bold, then the notes. (Not a
    rich Table: measuring one costs ~1 ms a row, too slow for a refresh of
    hundreds of runs.)"""
    from rich.text import Text

    cells = rows(doc)
    widths = {c: max(len(c), *(len(r[c]) for r in cells)) for c in _COLUMNS}

    def line(values: dict[str, str]) -> str:
        return "  ".join(
            values[c].rjust(widths[c]) if c in _RIGHT else values[c].ljust(widths[c]) for c in _COLUMNS
        ).rstrip()

    text = Text(line({c: c.upper() for c in _COLUMNS}) + "\n", style="bold", no_wrap=True, overflow="crop")
    text.append("\n".join(line(r) for r in cells) if cells else "no local run is running")
    for note in doc.get("notes") or []:
        text.append(f"\nnote: {note}", style="yellow")
    return text


@click.command("top")
@output_option()
@click.option("--once", is_flag=True, help="Print one table and exit (what a pipe gets anyway).")
def top(output: str, once: bool) -> None:
    """Running local runs, live: CPU %, memory, GPU memory and utilisation, elapsed, progress."""
    client = connected_client()
    doc = client.top()
    if output != "table":
        emit(doc, output)
        return
    if once or not sys.stdout.isatty():
        table = rows(doc)
        if table:
            emit(table, "table", columns=_COLUMNS)
        else:
            echo("no local run is running")
        for note in doc.get("notes") or []:
            echo(f"note: {note}", err=True)
        return
    from rich.live import Live

    interval = max(1.0, float(doc.get("interval_s") or 5.0))
    with Live(render_table(doc), auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render_table(client.top()), refresh=True)
        except KeyboardInterrupt:
            return
