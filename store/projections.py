"""Projections: run status and log lines, derived from events.

:class:`Projector` folds a batch of just-recorded events into the projection
tables (``runs``, ``log_sources``) inside
the writer's transaction, so a projection row is never ahead of or behind
the events it derives from. ``rebuild`` drops those tables and replays the
whole log through the very same fold, so the rebuilt rows equal the
incrementally maintained ones.

The rules (see :mod:`store.types` for the ``data`` shapes):

* ``Submitted`` creates the run row in phase ``QUEUED`` with ``created_at`` =
  the event's ``at`` (a repeated ``Submitted`` only updates project, name
  and backend). Events of a run without a ``Submitted`` create no row.
* ``PhaseChanged`` sets phase, reason, message and exit_code (absent keys
  become NULL). ``HandleRecorded`` sets ``handle``.
* ``LogLines`` records a block of lines (its text is in ``log_blocks``,
  written with the event by :class:`store.logblocks.BlockResolver`, which
  numbers the lines and drops replays); the projection keeps the newest
  recorded line of each source in ``log_sources`` (``last_pos``, and the
  block's last line number). A schema-2 ``LogLines`` event (lines inside
  it) takes these from the block the migration made of it.
* ``LogIngestPending`` sets ``log_ingest`` to ``"pending"``,
  ``LogIngestDone`` to ``"done"``.
* ``LogsArchived`` records where lines 1..N of the run are
  (``log_archives``) and, since the blocks have left ``log_blocks``, sets
  ``log_sources`` and ``log_lines`` from its data; ``LogsDeleted`` marks
  the ``log_archives`` row deleted.
* ``run_facts`` (one JSON object per run): ``Submitted`` ``scheduling``
  gives ``queue``, ``priority`` and ``after``; the first ``PhaseChanged``
  to RUNNING sets ``started_at``, the first terminal one ``ended_at``;
  ``Admitted`` sets ``gpus`` (indices); ``AttemptStarted`` sets ``attempt``; ``ResourceUsage`` sets ``usage``
  (cumulative CPU, peaks that never go down). See :func:`fold_facts`.
* Every event of a run sets its ``updated_at``, ``last_seq`` and ``version``;
  ``log_lines`` is the run's number of recorded lines.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Iterable, Sequence
from typing import Any, Final

import aiosqlite

from store.outputindex import apply_output_files
from store.runmeta import RUN_META_COLUMNS, apply_run_meta, run_meta_from_cell
from store.schema import PROJECTION_DDL, PROJECTION_TABLES
from store.types import (
    ADMITTED,
    ATTEMPT_STARTED,
    CONTAINER_TIMES,
    FACT_TYPES,
    HANDLE_RECORDED,
    INITIAL_PHASE,
    LOG_INGEST_DONE,
    LOG_INGEST_PENDING,
    LOG_LINES,
    LOGS_ARCHIVED,
    LOGS_DELETED,
    PHASE_CHANGED,
    PHASES,
    RESOURCE_USAGE,
    RUN_UPDATED,
    SUBMITTED,
    TERMINAL_PHASES,
    NewEvent,
    RecordedEvent,
    RunStatus,
)

__all__ = ["RUN_COLUMNS", "Projector", "fold_facts", "run_status_from_row", "validate_event"]

_STREAMS: Final = frozenset({"stdout", "stderr"})
_PHASES: Final = frozenset(PHASES)
#: SQLite's default limit on host parameters is 32766 (since 3.32); stay well below.
_IN_CHUNK: Final = 500

RUN_COLUMNS: Final = (
    "id, project, name, backend, phase, reason, message, exit_code, created_at,"
    " updated_at, last_seq, version, handle, log_lines, log_ingest,"
    " (SELECT facts FROM run_facts WHERE run_facts.run_id = runs.id), " + RUN_META_COLUMNS
    # The run's labels, sweep, params and progress (store.runmeta): keep last.
)
_UPSERT_FACTS: Final = (
    "INSERT INTO run_facts (run_id, facts) VALUES (?, ?) ON CONFLICT (run_id) DO UPDATE SET facts = excluded.facts"
)


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], etype: str, run_id: str) -> Any:
    if key not in data:
        raise ValueError(f"run {run_id}: {etype} event data needs key {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        raise ValueError(f"run {run_id}: {etype} data[{key!r}] must be {_kind_name(kind)}, got {value!r:.80}")
    return value


def _optional(data: dict[str, Any], key: str, kind: type, etype: str, run_id: str) -> None:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ValueError(f"run {run_id}: {etype} data[{key!r}] must be {_kind_name(kind)} or null, got {value!r:.80}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def validate_event(run_id: str, event: NewEvent) -> None:
    """Check an event before it is appended; raise ``ValueError`` naming the
    run, type and key at fault.

    Any ``type`` (a non-empty str) with a dict ``data`` is accepted; the
    projected types must also have the ``data`` shapes pinned in
    :mod:`store.types` (e.g. ``PhaseChanged`` needs a ``phase`` from
    :data:`store.types.PHASES`, ``LogLines`` needs ``stream`` stdout|stderr,
    ``source`` str and ``lines`` a list of ``[pos, text]`` str pairs).
    """
    if not isinstance(event, NewEvent):
        raise ValueError(f"run {run_id}: events must be NewEvent instances, got {type(event).__name__}")
    etype, data = event.type, event.data
    if not isinstance(etype, str) or not etype:
        raise ValueError(f"run {run_id}: event type must be a non-empty str, got {etype!r}")
    if not isinstance(data, dict):
        raise ValueError(f"run {run_id}: {etype} data must be a dict, got {type(data).__name__}")
    if etype == SUBMITTED:
        for key in ("project", "name", "backend"):
            _require(data, key, str, etype, run_id)
    elif etype == PHASE_CHANGED:
        phase = _require(data, "phase", str, etype, run_id)
        if phase not in _PHASES:
            raise ValueError(
                f"run {run_id}: PhaseChanged data['phase'] must be one of {', '.join(PHASES)}, got {phase!r}"
            )
        _optional(data, "reason", str, etype, run_id)
        _optional(data, "message", str, etype, run_id)
        _optional(data, "exit_code", int, etype, run_id)
    elif etype == HANDLE_RECORDED:
        _require(data, "handle", dict, etype, run_id)
    elif etype == LOG_LINES:
        stream = _require(data, "stream", str, etype, run_id)
        if stream not in _STREAMS:
            raise ValueError(f"run {run_id}: LogLines data['stream'] must be 'stdout' or 'stderr', got {stream!r}")
        _require(data, "source", str, etype, run_id)
        lines = _require(data, "lines", (list, tuple), etype, run_id)
        for i, line in enumerate(lines):
            if not (
                isinstance(line, (list, tuple))
                and len(line) == 2
                and isinstance(line[0], str)
                and isinstance(line[1], str)
            ):
                raise ValueError(
                    f"run {run_id}: LogLines data['lines'][{i}] must be a [pos, text] pair of str, got {line!r:.80}"
                )


@dataclasses.dataclass(slots=True)
class _RunRow:
    """A mutable ``runs`` row while a batch is folded into it."""

    id: str
    project: str
    name: str
    backend: str
    phase: str
    reason: str | None
    message: str | None
    exit_code: int | None
    created_at: str
    created_seq: int
    updated_at: str
    last_seq: int
    version: int
    handle: str
    log_lines: int
    log_ingest: str | None

    def params(self) -> tuple[Any, ...]:
        # Not dataclasses.astuple: it deep-copies every field (all scalars
        # here), which showed in the profile of a burst of appends.
        return _run_row_params(self)


_RUN_ROW_COLUMNS: Final = tuple(f.name for f in dataclasses.fields(_RunRow))
_run_row_params: Final = operator.attrgetter(*_RUN_ROW_COLUMNS)  # one C call for the tuple
_UPSERT_RUN: Final = (
    f"INSERT INTO runs ({', '.join(_RUN_ROW_COLUMNS)}) VALUES ({', '.join('?' * len(_RUN_ROW_COLUMNS))})"
    f" ON CONFLICT (id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in _RUN_ROW_COLUMNS[1:])}"
)
_UPSERT_SOURCE: Final = (
    "INSERT INTO log_sources (run_id, source, pos, line_no) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (run_id, source) DO UPDATE SET pos = excluded.pos, line_no = excluded.line_no"
)
# One primary-key seek per run (a bare ORDER BY ... LIMIT 1 subquery).
_LAST_LINE_NOS: Final = (
    "SELECT j.value, (SELECT first_line + lines - 1 FROM log_blocks WHERE run_id = j.value"
    " ORDER BY first_line DESC LIMIT 1) FROM json_each(?) AS j"
)
# A schema-2 LogLines event (its lines inside it): its last block, made by the migration.
_LEGACY_LAST: Final = (
    "SELECT last_pos, first_line + lines - 1 FROM log_blocks WHERE seq = ? ORDER BY first_line DESC LIMIT 1"
)

_UPSERT_ARCHIVE: Final = (
    "INSERT INTO log_archives (run_id, file, sha256, lines, bytes, archived_seq, archived_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET file = excluded.file,"
    " sha256 = excluded.sha256, lines = excluded.lines, bytes = excluded.bytes,"
    " archived_seq = excluded.archived_seq, archived_at = excluded.archived_at,"
    " deleted_seq = NULL, deleted_at = NULL"
)
_MARK_DELETED: Final = "UPDATE log_archives SET deleted_seq = ?, deleted_at = ? WHERE run_id = ?"

_Newest = dict[tuple[str, str], tuple[str, str, str, int]]


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _IN_CHUNK):
        yield items[i : i + _IN_CHUNK]


class Projector:
    """Maintains the projection tables; every method runs inside the
    caller's open write transaction on ``conn`` and never commits."""

    async def apply(
        self, conn: aiosqlite.Connection, events: Sequence[RecordedEvent], data_json: Sequence[str]
    ) -> None:
        """Fold ``events`` (seq order, already inserted into ``events``)
        into the projections; ``data_json[i]`` is the stored JSON text of
        ``events[i].data``. Raises ``sqlite3.Error`` (e.g. disk full); the
        caller rolls back."""
        if not events:
            return
        counted = {e.run_id for e in events if e.type in (LOG_LINES, SUBMITTED)}
        counts = await self._line_counts(conn, counted) if counted else {}
        newest: _Newest = {}
        for e in events:
            if e.type == LOGS_ARCHIVED:
                d = e.data
                for source, (last_pos, line_no) in (d.get("sources") or {}).items():
                    newest[(e.run_id, source)] = (e.run_id, source, str(last_pos), int(line_no))
                await conn.execute(
                    _UPSERT_ARCHIVE,
                    (e.run_id, d["file"], d["sha256"], int(d["lines"]), int(d.get("bytes") or 0), e.seq, e.at),
                )
                continue
            if e.type == LOGS_DELETED:
                await conn.execute(_MARK_DELETED, (e.seq, e.at, e.run_id))
                continue
            if e.type != LOG_LINES:
                continue
            data = e.data
            if isinstance(data.get("lines"), list):  # schema 2: the lines were inside the event
                rows = list(await conn.execute_fetchall(_LEGACY_LAST, (e.seq,)))
                if rows:
                    newest[(e.run_id, data["source"])] = (e.run_id, data["source"], str(rows[0][0]), int(rows[0][1]))
            elif data.get("line_count"):
                last = int(data["first_line"]) + int(data["line_count"]) - 1
                newest[(e.run_id, data["source"])] = (e.run_id, data["source"], str(data["last_pos"]), last)
        if newest:
            await conn.executemany(_UPSERT_SOURCE, list(newest.values()))
        await self._apply_runs(conn, events, counts)
        await self._apply_facts(conn, events)
        await apply_run_meta(conn, events)
        await apply_output_files(conn, events)

    @staticmethod
    async def _apply_facts(conn: aiosqlite.Connection, events: Sequence[RecordedEvent]) -> None:
        """Fold the batch's fact events into ``run_facts`` (one read and one
        upsert per batch that has any; log batches cost nothing)."""
        relevant = [e for e in events if e.type in FACT_TYPES]
        if not relevant:
            return
        facts: dict[str, dict[str, Any]] = {}
        for chunk in _chunks(sorted({e.run_id for e in relevant})):
            for r in await conn.execute_fetchall(
                f"SELECT run_id, facts FROM run_facts WHERE run_id IN ({', '.join('?' * len(chunk))})", chunk
            ):
                facts[str(r[0])] = json.loads(r[1])
        changed: set[str] = set()
        for e in relevant:
            current = facts.get(e.run_id)
            if current is None and e.type != SUBMITTED:
                continue  # as for the runs row: no Submitted, no facts
            folded = fold_facts(current or {}, e)
            if folded != current:
                facts[e.run_id] = folded
                changed.add(e.run_id)
        if changed:
            await conn.executemany(
                _UPSERT_FACTS,
                [(rid, json.dumps(facts[rid], separators=(",", ":"), ensure_ascii=False)) for rid in sorted(changed)],
            )

    async def rebuild(self, conn: aiosqlite.Connection, chunk_events: int = 5000) -> int:
        """Drop and recreate the projection tables, then replay every event
        in seq order, ``chunk_events`` at a time. Returns the number of
        events replayed."""
        for table in PROJECTION_TABLES:
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in PROJECTION_DDL:
            await conn.execute(statement)
        after, total = 0, 0
        while True:
            rows = list(
                await conn.execute_fetchall(
                    "SELECT seq, run_id, version, type, at, data FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                    (after, chunk_events),
                )
            )
            if not rows:
                return total
            events = [RecordedEvent(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]
            await self.apply(conn, events, [r[5] for r in rows])
            after = events[-1].seq
            total += len(events)

    @staticmethod
    async def _line_counts(conn: aiosqlite.Connection, run_ids: set[str]) -> dict[str, int]:
        """The last ``line_no`` of each of ``run_ids`` that has lines.

        One subquery per run answered with one primary-key seek (a ``MAX ...
        GROUP BY run_id`` would read every block of the run,
        https://sqlite.org/optoverview.html#minmax)."""
        rows = await conn.execute_fetchall(_LAST_LINE_NOS, (json.dumps(sorted(run_ids)),))
        return {str(r[0]): int(r[1]) for r in rows if r[1] is not None}

    @staticmethod
    async def _apply_runs(conn: aiosqlite.Connection, events: Sequence[RecordedEvent], counts: dict[str, int]) -> None:
        run_ids = sorted({e.run_id for e in events})
        rows: dict[str, _RunRow] = {}
        for chunk in _chunks(run_ids):
            for r in await conn.execute_fetchall(
                f"SELECT {', '.join(_RUN_ROW_COLUMNS)} FROM runs WHERE id IN ({', '.join('?' * len(chunk))})",
                chunk,
            ):
                rows[r[0]] = _RunRow(*r)
        changed: dict[str, _RunRow] = {}
        for e in events:
            row = rows.get(e.run_id)
            data = e.data
            if e.type == SUBMITTED:
                if row is None:
                    row = _RunRow(
                        id=e.run_id, project=data["project"], name=data["name"], backend=data["backend"],
                        phase=INITIAL_PHASE, reason=None, message=None, exit_code=None,
                        created_at=e.at, created_seq=e.seq, updated_at=e.at, last_seq=e.seq,
                        version=e.version, handle="{}", log_lines=0, log_ingest=None,
                    )  # fmt: skip
                    rows[e.run_id] = row
                else:
                    row.project, row.name, row.backend = data["project"], data["name"], data["backend"]
            if row is None:
                continue
            if e.type == PHASE_CHANGED:
                row.phase = data["phase"]
                row.reason = data.get("reason")
                row.message = data.get("message")
                row.exit_code = data.get("exit_code")
            elif e.type == HANDLE_RECORDED:
                row.handle = json.dumps(data["handle"], separators=(",", ":"), ensure_ascii=False)
            elif e.type == LOG_INGEST_PENDING:
                row.log_ingest = "pending"
            elif e.type == LOG_INGEST_DONE:
                row.log_ingest = "done"
            row.updated_at, row.last_seq, row.version = e.at, e.seq, e.version
            row.log_lines = max(row.log_lines, counts.get(e.run_id, row.log_lines))
            if e.type == LOG_LINES and data.get("line_count"):
                row.log_lines = max(row.log_lines, int(data["first_line"]) + int(data["line_count"]) - 1)
            elif e.type == LOGS_ARCHIVED:
                row.log_lines = max(row.log_lines, int(data["lines"]))
            changed[e.run_id] = row
        if changed:
            await conn.executemany(_UPSERT_RUN, [row.params() for row in changed.values()])


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def fold_facts(facts: dict[str, Any], e: RecordedEvent) -> dict[str, Any]:
    """``facts`` (a run's ``run_facts`` object) with event ``e`` folded in,
    as a new dict. Keys: ``started_at``, ``ended_at``, ``queue``,
    ``priority``, ``gpus`` [index], ``after`` [run id], ``usage``
    ``{cpu_s, max_rss_bytes, gpu_memory_max_bytes: {index: bytes}}``.
    Tolerant of odd data (a key of the wrong type is ignored)."""
    out = dict(facts)
    data = e.data
    if e.type == SUBMITTED:
        sched = data.get("scheduling")
        if isinstance(sched, dict):
            if isinstance(sched.get("queue"), str):
                out["queue"] = sched["queue"]
            if isinstance(sched.get("priority"), int):
                out["priority"] = sched["priority"]
            after = [str(r) for key in ("after", "after_any") for r in (sched.get(key) or []) if isinstance(r, str)]
            out["after"] = list(dict.fromkeys(after))
    elif e.type == PHASE_CHANGED:
        phase = data.get("phase")
        if phase == "RUNNING" and "started_at" not in out:
            out["started_at"] = e.at
        elif phase in TERMINAL_PHASES and "ended_at" not in out:
            out["ended_at"] = e.at
    elif e.type == CONTAINER_TIMES:
        started, finished = data.get("started_at"), data.get("finished_at")
        if isinstance(started, str) and started and not out.get("started_from_container"):
            out["started_at"] = started
            out["started_from_container"] = True
        if isinstance(finished, str) and finished:
            out["ended_at"] = finished
    elif e.type == RUN_UPDATED:
        new = data.get("new")
        if isinstance(new, dict):
            if isinstance(new.get("queue"), str):
                out["queue"] = new["queue"]
            if isinstance(new.get("priority"), int) and not isinstance(new.get("priority"), bool):
                out["priority"] = new["priority"]
    elif e.type == ATTEMPT_STARTED:
        attempt = data.get("attempt")
        if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > int(out.get("attempt") or 1):
            out["attempt"] = attempt
    elif e.type == ADMITTED:
        gpus = data.get("gpus")
        if isinstance(gpus, list):
            out["gpus"] = [int(g["index"]) for g in gpus if isinstance(g, dict) and isinstance(g.get("index"), int)]
    elif e.type == RESOURCE_USAGE:
        usage = dict(out.get("usage") or {})
        cpu = _number(data.get("cpu_s"))
        if cpu is not None:
            usage["cpu_s"] = round(max(cpu, float(usage.get("cpu_s") or 0.0)), 3)
        rss = _number(data.get("max_rss_bytes"))
        if rss is not None:
            usage["max_rss_bytes"] = int(max(rss, usage.get("max_rss_bytes") or 0))
        gmem = data.get("gpu_memory_max_bytes")
        if isinstance(gmem, dict):
            peaks = dict(usage.get("gpu_memory_max_bytes") or {})
            for index, value in gmem.items():
                v = _number(value)
                if v is not None:
                    peaks[str(index)] = int(max(v, peaks.get(str(index)) or 0))
            usage["gpu_memory_max_bytes"] = peaks
        out["usage"] = usage
    return out


def run_status_from_row(row: Sequence[Any]) -> RunStatus:
    """A :class:`RunStatus` from a ``runs`` row selected as :data:`RUN_COLUMNS`."""
    facts: dict[str, Any] = json.loads(row[15]) if len(row) > 15 and row[15] else {}
    return RunStatus(
        id=row[0], project=row[1], name=row[2], backend=row[3], phase=row[4], reason=row[5],
        message=row[6], exit_code=row[7], created_at=row[8], updated_at=row[9], last_seq=row[10],
        version=row[11], handle=json.loads(row[12]), log_lines=row[13], log_ingest=row[14],
        started_at=facts.get("started_at"), ended_at=facts.get("ended_at"), queue=facts.get("queue"),
        priority=facts.get("priority"), gpus=list(facts.get("gpus") or []), after=list(facts.get("after") or []),
        usage=facts.get("usage"), attempt=int(facts.get("attempt") or 1),
        **run_meta_from_cell(row[16] if len(row) > 16 else None),
    )  # fmt: skip
