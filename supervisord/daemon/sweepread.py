"""The read side of sweeps: resolving a sweep reference, expanding run
references that name sweeps, and a sweep's document with its results table.

Reads only (the store's projections and the sweep's ``SweepSubmitted``
event); imports nothing of the write side.

The sweep document (``GET /v1/sweeps/{ref}``, ``jobsup runs --sweep S -o
json``, the MCP ``sweep`` tool)::

    {"sweep": {"id", "project", "name", "command", "grid": {KEY: [values]},
               "count", "max_parallel", "labels", "created_at"},
     "params": [KEY...], "metrics": [NAME...],
     "rows": [{"id", "name", "index", "params": {KEY: value}, "phase",
               "reason", "exit_code", "started_at", "ended_at",
               "elapsed_s", "progress", "metrics": {NAME: value}}],
     "counts": {PHASE: n}}
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from store import SWEEP_SUBMITTED, EventStore
from supervisord.shared.exceptions import AmbiguousRunError, RunNotFoundError
from supervisord.shared.sweep import check_sweep_ref, is_sweep_ref

__all__ = ["expand_refs", "resolve_sweep_id", "sweep_document", "sweep_rows"]


async def resolve_sweep_id(store: EventStore, ref: str) -> str:
    """The full sweep id for ``ref`` (an id or a unique prefix of 5+
    characters). Raises UsageError (malformed), RunNotFoundError,
    AmbiguousRunError."""
    ref = check_sweep_ref(ref)
    ids = await store.match_sweep_ids(ref, limit=10)
    if not ids:
        raise RunNotFoundError(f"no sweep matches {ref!r} (see `jobsup runs --all`)")
    if len(ids) > 1:
        raise AmbiguousRunError(
            f"sweep id prefix {ref!r} matches several sweeps: {', '.join(ids)}; give more characters"
        )
    return ids[0]


async def expand_refs(store: EventStore, refs: Iterable[str], resolve_run: Any) -> list[str]:
    """Full run ids for ``refs``, in order without duplicates: a sweep
    reference stands for all of its runs (in sweep order), any other is
    resolved by ``resolve_run(ref)`` (an awaitable)."""
    out: dict[str, None] = {}
    for ref in refs:
        if is_sweep_ref(ref):
            sweep_id = await resolve_sweep_id(store, ref)
            for run in await store.sweep_runs(sweep_id):
                out.setdefault(run.id, None)
        else:
            out.setdefault(await resolve_run(ref), None)
    return list(out)


def _epoch(at: str | None) -> float | None:
    return None if at is None else dt.datetime.fromisoformat(at).timestamp()


def sweep_rows(table: Sequence[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """One results-table row per run (see the module docstring) from
    :meth:`store.EventStore.sweep_table`; a running run's ``elapsed_s``
    counts up to ``now`` (seconds since the epoch)."""
    rows = []
    for index, run in enumerate(table):
        started, ended = run["started_at"], run["ended_at"]
        start_s, end_s = _epoch(started), _epoch(ended)
        elapsed = None
        if start_s is not None:
            elapsed = round(max(0.0, (end_s if end_s is not None else now) - start_s), 1)
        progress = run["progress"]
        metrics = progress.get("metrics") if isinstance(progress, dict) else None
        rows.append(
            {
                "id": run["id"],
                "name": run["name"],
                "index": index,
                "params": dict(run["params"]),
                "phase": run["phase"],
                "reason": run["reason"],
                "exit_code": run["exit_code"],
                "started_at": started,
                "ended_at": ended,
                "elapsed_s": elapsed,
                "progress": progress,
                "metrics": dict(metrics) if isinstance(metrics, dict) else {},
            }
        )
    return rows


async def sweep_document(
    store: EventStore, ref: str, *, now: float | None = None, with_runs: bool = False
) -> dict[str, Any]:
    """The sweep document of ``ref`` (module docstring), with its run
    objects as ``runs`` when ``with_runs``. Raises UsageError,
    RunNotFoundError, AmbiguousRunError."""
    sweep_id = await resolve_sweep_id(store, ref)
    table = await store.sweep_table(sweep_id)
    events = await store.read_stream(sweep_id)
    head = next((e for e in events if e.type == SWEEP_SUBMITTED), None)
    data = dict(head.data) if head is not None else {}
    raw_grid = data.get("grid")
    grid: dict[str, Any] = dict(raw_grid) if isinstance(raw_grid, dict) else {}
    rows = sweep_rows(table, dt.datetime.now(dt.UTC).timestamp() if now is None else now)
    metrics: dict[str, None] = {}
    for row in rows:
        for name in row["metrics"]:
            metrics.setdefault(str(name), None)
    params = list(grid) or list(dict.fromkeys(k for r in rows for k in r["params"]))
    doc: dict[str, Any] = {
        "sweep": {
            "id": sweep_id,
            "project": data.get("project"),
            "name": data.get("name"),
            "command": data.get("command"),
            "grid": grid,
            "count": data.get("count", len(rows)),
            "max_parallel": data.get("max_parallel"),
            "labels": data.get("labels") or {},
            "created_at": head.at if head is not None else None,
        },
        "params": params,
        "metrics": list(metrics),
        "rows": rows,
        "counts": dict(Counter(r["phase"] for r in rows)),
    }
    if with_runs:
        doc["runs"] = [r.to_json() for r in await store.sweep_runs(sweep_id)]
    return doc
