"""Value types and the event vocabulary shared by the store and its users.

The store is generic: it records any event ``type`` with any JSON ``data``.
A few types, listed in :data:`PROJECTED_TYPES`, also drive the projections
(run status and log lines); their ``data`` shapes are pinned here because the
projections and every producer must agree on them.

Event types and their ``data`` (all keys optional unless marked *required*):

``Submitted`` (*first event of every run*, version 1)
    ``project`` *required* str, ``name`` *required* str, ``backend``
    *required* str, ``command`` str, ``timeout_s`` int, ``source`` mapping
    (commit, repo, snapshot sha256...), ``config`` mapping (effective config,
    secrets redacted), ``env`` mapping NAME -> a keyed digest of the value
    (never the value), ``on_done`` list of str (an argv the daemon runs when
    the run ends: ``submit --on-done``). The projection creates the run row
    in phase ``QUEUED``.
``PhaseChanged``
    ``phase`` *required* (one of :data:`PHASES`), ``reason`` str | None
    (one CamelCase word), ``message`` str | None, ``exit_code`` int | None.
    The projection sets phase, reason, message and exit_code (absent keys
    become NULL: each PhaseChanged states the whole outcome).
``HandleRecorded``
    ``handle`` *required* mapping: how the backend finds the run again
    (local: pid and process start time; kubernetes: namespace and object
    names). The projection stores it as the run's ``handle``.
``LogLines``
    Appended as ``stream`` *required* ``"stdout"`` | ``"stderr"``; ``source``
    *required* str naming where positions are measured (``"stdout"`` file,
    or ``"pod/container"``); ``lines`` *required* list of ``[pos, text]``
    pairs -- or as a :class:`store.logblocks.LogBlock` through
    ``EventStore.append_log``. Only lines past the source's newest recorded
    position are recorded (see :mod:`store.logblocks`): this is what makes
    replays after a reconnect or restart exactly-once. The text goes to
    ``log_blocks``; the *recorded* event (schema 3) is the audit record::

        {"stream", "source", "first_line": int, "line_count": int,
         "first_pos": str, "last_pos": str, "bytes": int,
         "sha256": "sha256:<hex of the block's text>", "replayed": int}

    (``first_pos`` .. ``sha256`` only when ``line_count`` > 0; ``replayed``
    counts the offered lines dropped as already recorded, when any.)
    Events recorded by schema 2 keep their ``lines`` pairs.
``LogIngestPending``
    The run's process has ended but its output is not all recorded yet:
    the terminal phase is recorded first, the backlog after it.
    ``bytes`` int: the backlog's size when this was recorded. The
    projection sets the run's ``log_ingest`` to ``"pending"``.
``LogIngestDone``
    The backlog announced by ``LogIngestPending`` is recorded (no data).
    The projection sets ``log_ingest`` to ``"done"``.
``LogsArchived``
    Retention moved the text of lines 1..``lines`` of the run into one
    compressed file (:mod:`store.archive`); their block rows left the
    database in the same transaction. ``file`` *required* str (its name
    under the archive folder), ``sha256`` *required* ``"sha256:<hex>"`` of
    the whole file, ``lines`` *required* int, ``bytes`` int (text bytes),
    ``file_bytes`` int, ``blocks`` int, ``sources`` {source: [last_pos,
    line_no]} (the newest line of each source it holds). The projection
    fills ``log_archives`` (and keeps ``log_lines`` and ``log_sources``
    whole without the blocks).
``LogsDeleted``
    Retention deleted the archived text: ``file``, ``sha256`` *required*
    (the digest the text's archive had), ``lines`` int. The projection
    marks the ``log_archives`` row deleted; reads then say when.
``Admitted`` / ``ResourceUsage`` (the scheduler / the usage sampler)
    Projected into the run's *facts* only (``run_facts``): ``Admitted``
    ``gpus`` [{``index``, ...}] sets ``gpus`` (the indices);
    ``ResourceUsage`` ``cpu_s`` (cumulative), ``max_rss_bytes`` and
    ``gpu_memory_max_bytes`` {index: bytes} set ``usage`` (peaks never go
    down). ``Submitted`` ``scheduling`` gives ``queue``, ``priority`` and
    ``after`` (``after`` and ``after_any`` ids); the first PhaseChanged to
    RUNNING sets ``started_at``, the first terminal one ``ended_at``.
``ContainerTimes`` (a backend that knows when the run's process really ran: Kubernetes)
    ``started_at`` / ``finished_at`` (RFC 3339, each optional) from the
    script container's state: the first ``started_at`` replaces the one
    from the RUNNING event (when jobsup saw it), the last ``finished_at``
    the one from the terminal event.
Any other type (jobsup's are cataloged in ``supervisord.shared.events``)
    Recorded in the log and bump the run's ``updated_at``/``last_seq``/
    ``version``, but change no other projected column.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Sequence
from typing import Any, Final, Literal, get_args

__all__ = [
    "ADMITTED",
    "ATTEMPT_ENDED",
    "ATTEMPT_STARTED",
    "CANCEL_REQUESTED",
    "CONTAINER_TIMES",
    "FACT_TYPES",
    "HANDLE_RECORDED",
    "INITIAL_PHASE",
    "LOGS_ARCHIVED",
    "LOGS_DELETED",
    "LOG_INGEST_DONE",
    "LOG_INGEST_PENDING",
    "LOG_LINES",
    "OUTPUTS_RECORDED",
    "PHASES",
    "PHASE_CHANGED",
    "PHASE_RANK",
    "PROGRESS",
    "PROJECTED_TYPES",
    "RESOURCE_USAGE",
    "RUN_UPDATED",
    "STAGING_STEP",
    "SUBMITTED",
    "SWEEP_SUBMITTED",
    "TERMINAL_PHASES",
    "Checkpoint",
    "LogLine",
    "NewEvent",
    "Phase",
    "RecordedEvent",
    "RunStatus",
    "StoreStatistics",
]

# The run lifecycle's phases are defined here, once (the store validates and
# projects them; store knows nothing of supervisord). The rules that use them
# (no going backwards, terminal is final, a cancel owns the outcome) are in
# supervisord.shared.lifecycle.

#: Every phase, in lifecycle order (README, "Phases and reasons"): the active phases,
#: then the terminal ones.
Phase = Literal["QUEUED", "SCHEDULING", "STAGING", "RUNNING", "COMPLETED", "ERROR", "CANCELED", "DELETED"]
PHASES: Final[tuple[str, ...]] = get_args(Phase)
#: The phase a run is created in (by its Submitted event).
INITIAL_PHASE: Final = PHASES[0]
#: A run in one of these phases never changes phase again: the last four.
TERMINAL_PHASES: Final[frozenset[str]] = frozenset(PHASES[PHASES.index("COMPLETED") :])
#: Lifecycle rank of each phase: its position, every terminal phase sharing
#: the rank after RUNNING's (a run moves only to a higher rank, or sideways
#: within the active rank it is at).
PHASE_RANK: Final[dict[str, int]] = {p: min(i, PHASES.index("COMPLETED")) for i, p in enumerate(PHASES)}

SUBMITTED: Final = "Submitted"
PHASE_CHANGED: Final = "PhaseChanged"
HANDLE_RECORDED: Final = "HandleRecorded"
LOG_LINES: Final = "LogLines"
LOG_INGEST_PENDING: Final = "LogIngestPending"
LOG_INGEST_DONE: Final = "LogIngestDone"
CANCEL_REQUESTED: Final = "CancelRequested"
STAGING_STEP: Final = "StagingStep"
LOGS_ARCHIVED: Final = "LogsArchived"
LOGS_DELETED: Final = "LogsDeleted"
ADMITTED: Final = "Admitted"
RESOURCE_USAGE: Final = "ResourceUsage"
#: When the run's script container really started/finished (a backend that can tell: Kubernetes).
CONTAINER_TIMES: Final = "ContainerTimes"
#: A run's progress report (its data becomes the run's ``progress``: store.runmeta).
PROGRESS: Final = "Progress"
#: A sweep's grid, on the sweep's own stream (the sweep id), before its runs' Submitted.
SWEEP_SUBMITTED: Final = "SweepSubmitted"
#: A retried run's attempts (supervisord.shared.retry): one ended (and another is
#: due), the next one started (``attempt``: 2, 3, ...; a run's facts keep it).
ATTEMPT_ENDED: Final = "AttemptEnded"
ATTEMPT_STARTED: Final = "AttemptStarted"
#: A run's outputs folder listed with each file's sha256 (store.outputindex
#: indexes its files by digest for ``jobsup which``).
OUTPUTS_RECORDED: Final = "OutputsRecorded"
#: `jobsup update` of a queued run: its ``new`` priority and queue are the run's facts from then on.
RUN_UPDATED: Final = "RunUpdated"

#: Event types that change projected columns beyond the bookkeeping ones.
PROJECTED_TYPES: Final[frozenset[str]] = frozenset(
    {
        SUBMITTED,
        PHASE_CHANGED,
        HANDLE_RECORDED,
        LOG_LINES,
        LOG_INGEST_PENDING,
        LOG_INGEST_DONE,
        LOGS_ARCHIVED,
        LOGS_DELETED,
        ADMITTED,
        RESOURCE_USAGE,
        CONTAINER_TIMES,
    }
)
#: Event types that change a run's facts (times, placement, usage: ``run_facts``).
FACT_TYPES: Final[frozenset[str]] = frozenset(
    {SUBMITTED, PHASE_CHANGED, ADMITTED, RESOURCE_USAGE, CONTAINER_TIMES, ATTEMPT_STARTED, RUN_UPDATED}
)


@dataclasses.dataclass(frozen=True, slots=True)
class NewEvent:
    """An event not yet appended: its ``type`` and JSON-serialisable ``data``."""

    type: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where the subscriber ``name`` (e.g. ``hook:notify``) has got to in
    the log: ``seq`` is the last event it has finished with (>= 0).

    Passed to ``EventStore.append`` it moves in the same transaction as the
    appended events (pyeventsourcing's ``Tracking`` record, kept as one row
    per subscriber); it never moves backwards.
    """

    name: str
    seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Append:
    """One append of :meth:`EventStore.append_many`: the arguments of
    :meth:`EventStore.append` (``events`` to the stream of ``run_id`` at
    ``expected_version``, ``checkpoint`` moved in the same transaction)."""

    run_id: str
    expected_version: int | None
    events: Sequence[NewEvent]
    checkpoint: Checkpoint | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedEvent:
    """One immutable row of the event log.

    ``seq`` is global and strictly increasing; ``version`` counts 1, 2, 3...
    within ``run_id``; ``at`` is UTC in RFC 3339 with microseconds and a
    ``Z`` suffix (e.g. ``2026-11-29T15:27:52.123456Z``).
    """

    seq: int
    run_id: str
    version: int
    type: str
    at: str
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The wire shape: a plain dict with the same keys."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class RunStatus:
    """The run-status projection of one run (one row of ``runs``).

    Times are RFC 3339 UTC strings as in :class:`RecordedEvent`. ``handle`` is
    the last ``HandleRecorded`` data (``{}`` before one). ``version`` is the
    run's stream version (the ``expected_version`` for the next append).
    """

    id: str
    project: str
    name: str
    backend: str
    phase: str
    reason: str | None
    message: str | None
    exit_code: int | None
    created_at: str
    updated_at: str
    last_seq: int
    version: int
    handle: dict[str, Any]
    log_lines: int
    #: ``"pending"`` while a terminal run's output backlog is still being
    #: recorded, ``"done"`` once it is, None when no backlog was announced.
    log_ingest: str | None = None
    #: When it reached RUNNING / a terminal phase (None: not yet).
    started_at: str | None = None
    ended_at: str | None = None
    #: Its queue and priority (Submitted ``scheduling``; None before scheduling existed).
    queue: str | None = None
    priority: int | None = None
    #: The indices of the GPUs it was admitted on.
    gpus: list[int] = dataclasses.field(default_factory=list)
    #: The runs it waits for (``--after`` and ``--after-any``).
    after: list[str] = dataclasses.field(default_factory=list)
    #: What it used (``ResourceUsage``): ``{"cpu_s": float, "max_rss_bytes":
    #: int, "gpu_memory_max_bytes": {index: int}}``; None before a sample.
    usage: dict[str, Any] | None = None
    #: The sweep the run belongs to (``s`` + 11 hex), its ``labels`` and
    #: sweep ``params`` (str -> str), and its last ``Progress`` event's data
    #: with that event's ``at`` and ``seq`` (None before one): store.runmeta.
    sweep_id: str | None = None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    progress: dict[str, Any] | None = None
    #: The attempt under way, or the last one (1 unless the run was retried:
    #: its ``AttemptStarted`` events, supervisord.shared.retry).
    attempt: int = 1

    @property
    def terminal(self) -> bool:
        """True once the run is in a terminal phase."""
        return self.phase in TERMINAL_PHASES

    def elapsed_s(self, now: float | None = None) -> float | None:
        """Seconds from ``started_at`` to ``ended_at`` (or to ``now``, epoch
        seconds, default the clock, while it runs), 0.1 s precision; None
        before it started."""
        if self.started_at is None:
            return None
        start = _epoch(self.started_at)
        end = _epoch(self.ended_at) if self.ended_at is not None else (time.time() if now is None else now)
        return round(max(0.0, end - start), 1)

    def to_json(self) -> dict[str, Any]:
        """The wire shape used by the API and ``-o json`` (with ``elapsed_s``)."""
        out = dataclasses.asdict(self)
        out["elapsed_s"] = self.elapsed_s()
        return out


def _epoch(at: str) -> float:
    """Epoch seconds of an RFC 3339 UTC time as :class:`RecordedEvent` writes it."""
    return dt.datetime.fromisoformat(at).timestamp()


@dataclasses.dataclass(frozen=True, slots=True)
class LogLine:
    """One projected log line: ``line_no`` counts 1, 2, 3... within the run,
    in the order lines were first recorded; ``seq`` is the event that carried it."""

    run_id: str
    line_no: int
    stream: str
    source: str
    pos: str
    text: str
    seq: int

    def to_json(self) -> dict[str, Any]:
        """The wire shape used by the API."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class StoreStatistics:
    """Counters of one open :class:`~store.EventStore`, from
    :meth:`~store.EventStore.statistics` (read from memory: no query).

    ``last_seq``: the highest seq committed and published. ``transactions``:
    append batches committed since the store opened (many appends share one
    when they arrive together). ``reads``: queries run on the read
    connections since it opened. ``waiters``: ``wait_for_events`` /
    ``subscribe`` callers registered right now; ``waited_runs``: how many
    distinct runs those waiting on given runs name. ``storage_incidents``:
    storage troubles (disk full, locked, I/O error) started since it opened.
    """

    last_seq: int
    transactions: int
    reads: int
    waiters: int
    waited_runs: int
    storage_incidents: int
