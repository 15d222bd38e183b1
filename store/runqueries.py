"""Queries of the run projection: one run, several, a page, by prefix.

A role of :class:`store.eventstore.EventStore` (its methods keep their
names there)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from store._core import (
    _EVENT_COLUMNS,
    StoreCore,
    _event_from_row,
    _frozen,
    _placeholders,
)
from store.outputindex import outputs_by_sha256_sql
from store.projections import RUN_COLUMNS, run_status_from_row
from store.types import (
    TERMINAL_PHASES,
    RecordedEvent,
    RunStatus,
)

__all__ = ["RunQueries", "sqlite_glob"]


def sqlite_glob(pattern: str) -> str:
    """A shell pattern as :func:`fnmatch.fnmatchcase` reads it, as SQLite's
    ``GLOB`` operand: the same ``*``, ``?`` and ``[...]``; a negated set is
    ``[!...]`` in the shell, ``[^...]`` in SQLite."""
    return pattern.replace("[!", "[^")


class RunQueries(StoreCore):
    """Queries of the run projection: one run, several, a page, by prefix."""

    async def get_run(self, run_id: str) -> RunStatus | None:
        """The run-status projection of ``run_id`` (exact id), or None."""
        rows = await self._read(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return run_status_from_row(rows[0]) if rows else None

    async def get_runs(self, run_ids: Collection[str]) -> dict[str, RunStatus]:
        """The run-status projections of those of ``run_ids`` (exact ids)
        that exist, in one query: run id -> RunStatus."""
        ids = sorted(set(run_ids))
        if not ids:
            return {}
        rows = await self._read(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)
        )
        return {status.id: status for status in map(run_status_from_row, rows)}

    async def first_events(self, run_ids: Collection[str]) -> dict[str, RecordedEvent]:
        """The first event (version 1: the Submitted event) of each of
        ``run_ids`` that has one, in one query: run id -> RecordedEvent."""
        ids = sorted(set(run_ids))
        if not ids:
            return {}
        rows = await self._read(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE version = 1 AND run_id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),),
        )
        return {event.run_id: event for event in map(_event_from_row, rows)}

    async def run_events(self, run_ids: Collection[str], types: Collection[str]) -> dict[str, list[RecordedEvent]]:
        """The events of ``types`` of each of ``run_ids``, in one query (not
        one per run: a restart reads those of every live run at once): run
        id -> its events in version order (runs with none are left out)."""
        ids, kinds = sorted(set(run_ids)), sorted(set(types))
        if not ids or not kinds:
            return {}
        rows = await self._read(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE run_id IN (SELECT value FROM json_each(?))"
            " AND type IN (SELECT value FROM json_each(?)) ORDER BY run_id, version",
            (json.dumps(ids), json.dumps(kinds)),
        )
        out: dict[str, list[RecordedEvent]] = {}
        for event in map(_event_from_row, rows):
            out.setdefault(event.run_id, []).append(event)
        return out

    async def last_log_positions(self, run_ids: Collection[str]) -> dict[str, dict[str, str]]:
        """:meth:`last_log_position` of every source of each of ``run_ids``,
        in one query: run id -> source -> ``pos`` (runs with no recorded
        line are left out)."""
        ids = sorted(set(run_ids))
        if not ids:
            return {}
        rows = await self._read(
            "SELECT run_id, source, pos FROM log_sources WHERE run_id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),),
        )
        out: dict[str, dict[str, str]] = {}
        for run_id, source, pos in rows:
            if pos is not None:
                out.setdefault(str(run_id), {})[str(source)] = str(pos)
        return out

    async def list_runs(
        self,
        *,
        project: str | None = None,
        phases: Collection[str] | None = None,
        non_terminal_only: bool = False,
        name: str | None = None,
        log_ingest: str | None = None,
    ) -> list[RunStatus]:
        """Runs matching every given filter, newest (latest Submitted) first
        (``log_ingest``: only runs whose ``log_ingest`` is that value)."""
        where: list[str] = []
        params: list[Any] = []
        if project is not None:
            where.append("project = ?")
            params.append(project)
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if log_ingest is not None:
            where.append("log_ingest = ?")
            params.append(log_ingest)
        wanted = _frozen(phases, "phases")
        if wanted is not None:
            if not wanted:
                return []
            where.append(f"phase IN ({_placeholders(len(wanted))})")
            params.extend(sorted(wanted))
        if non_terminal_only:
            where.append(f"phase NOT IN ({_placeholders(len(TERMINAL_PHASES))})")
            params.extend(sorted(TERMINAL_PHASES))
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = await self._read(f"SELECT {RUN_COLUMNS} FROM runs{clause} ORDER BY created_seq DESC", params)
        return [run_status_from_row(r) for r in rows]

    async def page_runs(
        self,
        *,
        limit: int,
        before: int | None = None,
        project: str | None = None,
        phases: Collection[str] | None = None,
        name: str | None = None,
        backend: str | None = None,
        name_glob: str | None = None,
        labels: Mapping[str, str] | None = None,
        sweep_id: str | None = None,
    ) -> tuple[list[RunStatus], int | None]:
        """One page of runs, newest first: up to ``limit`` runs submitted
        before the cursor ``before`` (None = the newest), matching every given
        filter. Returns the page and the cursor of the next (older) page, or
        None when this page is the last. Reads only the page's rows (the
        ``runs_by_created`` index), whatever the number of runs.

        ``name_glob``: the name matches this shell pattern (``*``, ``?``,
        ``[...]``, ``[!...]``: :func:`fnmatch.fnmatchcase`'s, case-sensitive);
        ``labels``: the run carries every one of these labels (``run_meta``);
        ``sweep_id``: the run belongs to that sweep (an exact id)."""
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit!r}")
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("project", project), ("name", name), ("backend", backend)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if name_glob is not None:
            where.append("name GLOB ?")
            params.append(sqlite_glob(name_glob))
        for key, value in sorted((labels or {}).items()):
            where.append(
                "EXISTS (SELECT 1 FROM run_meta AS m, json_each(m.labels) AS l"
                " WHERE m.run_id = runs.id AND l.key = ? AND l.value = ?)"
            )
            params.extend((key, value))
        if sweep_id is not None:
            where.append("id IN (SELECT run_id FROM run_meta WHERE sweep_id = ?)")
            params.append(sweep_id)
        wanted = _frozen(phases, "phases")
        if wanted is not None:
            if not wanted:
                return [], None
            where.append(f"phase IN ({_placeholders(len(wanted))})")
            params.extend(sorted(wanted))
        if before is not None:
            where.append("created_seq < ?")
            params.append(before)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = await self._read(
            f"SELECT {RUN_COLUMNS}, created_seq FROM runs{clause} ORDER BY created_seq DESC LIMIT ?",
            (*params, limit + 1),
        )
        page = [run_status_from_row(r[:-1]) for r in rows[:limit]]
        cursor = int(rows[limit - 1][-1]) if len(rows) > limit else None
        return page, cursor

    async def sweep_runs(self, sweep_id: str) -> list[RunStatus]:
        """The runs of sweep ``sweep_id`` (exact id), in sweep index order."""
        rows = await self._read(
            f"SELECT {RUN_COLUMNS} FROM runs JOIN run_meta AS j ON j.run_id = runs.id"
            " WHERE j.sweep_id = ? ORDER BY j.sweep_index, runs.created_seq",
            (sweep_id,),
        )
        return [run_status_from_row(r) for r in rows]

    async def sweep_table(self, sweep_id: str) -> list[dict[str, Any]]:
        """The runs of sweep ``sweep_id`` as its results table needs them,
        in sweep index order, in one query (no full run objects): ``{"id",
        "name", "phase", "reason", "exit_code", "params", "progress",
        "started_at", "ended_at"}`` (times: the ``at`` of the run's first
        RUNNING and of its terminal PhaseChanged, None when none yet)."""
        terminal = ", ".join(f"'{p}'" for p in sorted(TERMINAL_PHASES))
        rows = await self._read(
            "SELECT r.id, r.name, r.phase, r.reason, r.exit_code, m.params, m.progress,"
            " (SELECT MIN(e.at) FROM events AS e WHERE e.run_id = r.id AND e.type = 'PhaseChanged'"
            "  AND json_extract(e.data, '$.phase') = 'RUNNING'),"
            f" CASE WHEN r.phase IN ({terminal}) THEN (SELECT MAX(e.at) FROM events AS e WHERE e.run_id = r.id"
            f"  AND e.type = 'PhaseChanged' AND json_extract(e.data, '$.phase') IN ({terminal})) END"
            " FROM run_meta AS m JOIN runs AS r ON r.id = m.run_id WHERE m.sweep_id = ?"
            " ORDER BY m.sweep_index, r.created_seq",
            (sweep_id,),
        )
        return [
            {
                "id": r[0],
                "name": r[1],
                "phase": r[2],
                "reason": r[3],
                "exit_code": r[4],
                "params": json.loads(r[5]) if r[5] else {},
                "progress": json.loads(r[6]) if r[6] else None,
                "started_at": r[7],
                "ended_at": r[8],
            }
            for r in rows
        ]

    async def outputs_by_sha256(self, digests: Collection[str]) -> dict[str, list[dict[str, Any]]]:
        """The recorded output files whose sha256 is one of ``digests``
        (lower-case hex), from the ``output_files`` index (one range read
        per digest): digest -> ``[{"run", "path", "bytes", "mtime",
        "recorded_at"}]``, oldest first (digests with none are absent)."""
        if not digests:
            return {}
        sql, params = outputs_by_sha256_sql(list(digests))
        out: dict[str, list[dict[str, Any]]] = {}
        for sha, run_id, path, size, mtime, at in await self._read(sql, params):
            out.setdefault(str(sha), []).append(
                {"run": run_id, "path": path, "bytes": size, "mtime": mtime, "recorded_at": at}
            )
        return out

    async def match_sweep_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` sweep ids starting with ``prefix`` (non-empty), sorted."""
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = await self._read(
            "SELECT DISTINCT sweep_id FROM run_meta WHERE sweep_id >= ? AND sweep_id < ? ORDER BY sweep_id LIMIT ?",
            (prefix, upper, limit),
        )
        return [str(r[0]) for r in rows]

    async def match_run_ids(self, prefix: str, limit: int = 10) -> list[str]:
        """Up to ``limit`` run ids starting with ``prefix``, sorted."""
        if not prefix:
            rows = await self._read("SELECT id FROM runs ORDER BY id LIMIT ?", (limit,))
        else:
            upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            rows = await self._read(
                "SELECT id FROM runs WHERE id >= ? AND id < ? ORDER BY id LIMIT ?", (prefix, upper, limit)
            )
        return [str(r[0]) for r in rows]
