"""``jobsup runs --sweep S``: a sweep's results table (the rows and
columns of :mod:`supervisord.shared.sweeptable`) as a table, CSV, JSON or YAML.
Imports nothing of click (the CLI's fast path runs it)."""

from __future__ import annotations

from supervisord.client.api import Client
from supervisord.client.cli.output import echo, emit, info
from supervisord.shared.sweeptable import flat_rows, sort_rows, table_columns, to_csv

__all__ = ["sweep_command"]


def sweep_command(
    client: Client,
    ref: str,
    *,
    phase: str | None = None,
    labels: dict[str, str] | None = None,
    name: str | None = None,
    sort_key: str | None = None,
    as_csv: bool = False,
    output: str = "table",
) -> int:
    """``jobsup runs --sweep S``: the sweep's results table (``-o json``:
    its document; ``as_csv``: CSV), its rows filtered by ``phase``,
    ``labels``, a ``name`` glob and sorted by ``sort_key``."""
    doc = client.sweep(ref)
    if phase or labels or name:
        keep = {r["id"] for r in client.runs(sweep=doc["sweep"]["id"], phase=phase, labels=labels, name=name)}
        doc["rows"] = [r for r in doc["rows"] if r["id"] in keep]
    columns = table_columns(doc)
    rows = flat_rows(doc)
    if sort_key:
        rows = sort_rows(rows, sort_key, columns)
        order = {r["id"]: i for i, r in enumerate(rows)}
        doc["rows"] = sorted(doc["rows"], key=lambda r: order[r["id"]])
    if as_csv:
        echo(to_csv(rows, columns), nl=False)
        return 0
    if output != "table":
        emit(doc, output)
        return 0
    sweep = doc["sweep"]
    counts = ", ".join(f"{n} {p}" for p, n in sorted(doc.get("counts", {}).items()))
    info(f"sweep {sweep['id']} {sweep.get('name') or ''}: {sweep.get('count')} runs ({counts})")
    if rows:
        emit(rows, "table", columns=columns)
    return 0
