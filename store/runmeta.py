"""The ``run_meta`` projection: a run's labels, sweep and params, and its
last progress.

One row per run, created by its ``Submitted`` event (its ``labels``,
``sweep_id``, ``sweep_index`` and ``params`` keys) and updated by each
``Progress`` event (its whole data becomes the run's ``progress``). Run
objects carry these columns (:data:`store.projections.RUN_COLUMNS` selects
them with one primary-key seek per run); ``sweep_id`` is indexed, so the
runs of a sweep are one range read.

``SweepSubmitted`` (a sweep's grid, recorded on the sweep's own stream,
whose id is the sweep id) creates no row here: a sweep is the set of runs
that name it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from store.types import PROGRESS, SUBMITTED, RecordedEvent

if TYPE_CHECKING:
    import aiosqlite

__all__ = [
    "RUN_META_COLUMNS",
    "RUN_META_DDL",
    "apply_run_meta",
    "run_meta_from_cell",
]

RUN_META_DDL: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS run_meta (
        run_id      TEXT    PRIMARY KEY,
        sweep_id    TEXT,
        sweep_index INTEGER,
        labels      TEXT    NOT NULL,
        params      TEXT    NOT NULL,
        progress    TEXT
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS run_meta_by_sweep ON run_meta (sweep_id, sweep_index)",
)

#: What a ``runs`` query adds to each row (``runs`` unaliased in the FROM):
#: one JSON array ``[sweep_id, labels, params, progress]``, or NULL.
RUN_META_COLUMNS: Final = (
    "(SELECT json_array(m.sweep_id, json(m.labels), json(m.params), json(m.progress))"
    " FROM run_meta AS m WHERE m.run_id = runs.id)"
)

_INSERT: Final = (
    "INSERT INTO run_meta (run_id, sweep_id, sweep_index, labels, params, progress) VALUES (?, ?, ?, ?, ?, NULL)"
    " ON CONFLICT (run_id) DO UPDATE SET sweep_id = excluded.sweep_id, sweep_index = excluded.sweep_index,"
    " labels = excluded.labels, params = excluded.params"
)
_PROGRESS: Final = (
    "INSERT INTO run_meta (run_id, sweep_id, sweep_index, labels, params, progress) VALUES (?, NULL, NULL, '{}', '{}', ?)"
    " ON CONFLICT (run_id) DO UPDATE SET progress = excluded.progress"
)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


async def apply_run_meta(conn: aiosqlite.Connection, events: Sequence[RecordedEvent]) -> None:
    """Fold ``events`` (seq order, inside the writer's transaction) into
    ``run_meta``: each ``Submitted`` sets the run's labels, sweep and params;
    each ``Progress`` its progress (the last one of a batch wins)."""
    inserts: list[tuple[Any, ...]] = []
    progress: dict[str, str] = {}
    for e in events:
        if e.type == SUBMITTED:
            d = e.data
            sweep = d.get("sweep_id")
            index = d.get("sweep_index")
            inserts.append(
                (
                    e.run_id,
                    str(sweep) if isinstance(sweep, str) and sweep else None,
                    index if isinstance(index, int) and not isinstance(index, bool) else None,
                    _dumps(_str_map(d.get("labels"))),
                    _dumps(_str_map(d.get("params"))),
                )
            )
            progress.pop(e.run_id, None)
        elif e.type == PROGRESS:
            progress[e.run_id] = _dumps({**e.data, "at": e.at, "seq": e.seq})
    if inserts:
        await conn.executemany(_INSERT, inserts)
    if progress:
        await conn.executemany(_PROGRESS, list(progress.items()))


def run_meta_from_cell(cell: str | None) -> dict[str, Any]:
    """The run-object fields from a :data:`RUN_META_COLUMNS` cell:
    ``{"sweep_id", "labels", "params", "progress"}`` (defaults when None)."""
    if not cell:
        return {"sweep_id": None, "labels": {}, "params": {}, "progress": None}
    sweep_id, labels, params, progress = json.loads(cell)
    return {"sweep_id": sweep_id, "labels": labels or {}, "params": params or {}, "progress": progress}
