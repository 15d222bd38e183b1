"""A sweep's results table, from its document (``GET /v1/sweeps/{ref}``,
:mod:`supervisord.daemon.sweepread`): one row per run with its params, phase,
elapsed time, step and last metrics as columns; sorted by any of them;
as CSV. Pure: used by ``jobsup runs --sweep S``
(:mod:`supervisord.client.cli.sweep_table`), the MCP ``sweep`` tool and the web
page's sweep view.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

from supervisord.shared.exceptions import UsageError

__all__ = ["flat_rows", "sort_rows", "table_columns", "to_csv"]

#: Columns every results table has besides params and metrics.
_FIXED = ("phase", "elapsed_s", "step")


def _step(row: Mapping[str, Any]) -> Any:
    progress = row.get("progress") or {}
    step, total = progress.get("step"), progress.get("total")
    if step is None:
        return None
    return f"{step}/{total}" if total is not None else step


def table_columns(doc: Mapping[str, Any]) -> list[str]:
    """The table's columns: ``id``, each param, phase, elapsed_s, step,
    each metric (a param and a metric of one name: the metric gets ``m:``)."""
    params = [str(p) for p in doc.get("params") or []]
    metrics = [m if m not in params and m not in _FIXED and m != "id" else f"m:{m}" for m in doc.get("metrics") or []]
    return ["id", *params, *_FIXED, *metrics]


def flat_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The document's rows flattened to :func:`table_columns` keys."""
    params = [str(p) for p in doc.get("params") or []]
    out = []
    for row in doc.get("rows") or []:
        flat: dict[str, Any] = {"id": row["id"]}
        for p in params:
            flat[p] = (row.get("params") or {}).get(p)
        flat["phase"] = row.get("phase") if not row.get("reason") else f"{row['phase']} ({row['reason']})"
        flat["elapsed_s"] = row.get("elapsed_s")
        flat["step"] = _step(row)
        for m in doc.get("metrics") or []:
            key = m if m not in params and m not in _FIXED and m != "id" else f"m:{m}"
            flat[key] = (row.get("metrics") or {}).get(m)
        out.append(flat)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def sort_rows(rows: Sequence[dict[str, Any]], key: str, columns: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` sorted by column ``key`` (a metric, param, ``phase``,
    ``elapsed_s``...), ascending; ``-key`` descending. Numbers compare as
    numbers; rows without the value come last. Raises UsageError naming
    ``--sort`` for an unknown column."""
    descending = key.startswith("-")
    name = key[1:] if descending else key
    if name not in columns:
        if f"m:{name}" in columns:
            name = f"m:{name}"
        else:
            raise UsageError(f"--sort {key!r}: not a column of this sweep; use one of {', '.join(columns)}")
    have = [r for r in rows if r.get(name) is not None]
    missing = [r for r in rows if r.get(name) is None]
    numeric = all(_number(r[name]) is not None for r in have)

    def sort_key(r: dict[str, Any]) -> Any:
        return _number(r[name]) if numeric else str(r[name])

    return sorted(have, key=sort_key, reverse=descending) + missing


def to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """The rows as CSV text with a header line (empty cells for none)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow(["" if r.get(c) is None else r.get(c) for c in columns])
    return buf.getvalue()
