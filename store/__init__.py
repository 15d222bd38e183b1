"""jobsup's event store: an append-only event log in one SQLite file, with
run-status and log-line projections and race-free subscriptions.

Entry point: ``store = await EventStore.open(path)``. Event types and their
``data`` shapes are in :mod:`store.types`; errors in :mod:`store.errors`.
"""

from store.errors import (
    ConcurrencyError,
    NotADatabaseError,
    SchemaTooNewError,
    StorageFullError,
    StoreClosedError,
    StoreError,
    StoreLockedError,
    StoreOpenError,
)
from store.eventstore import EventStore
from store.logblocks import LogBlock
from store.logsplit import MAX_LINE_BYTES, split_block, split_lines, split_text
from store.schema import SCHEMA_VERSION
from store.types import (
    CANCEL_REQUESTED,
    HANDLE_RECORDED,
    LOG_INGEST_DONE,
    LOG_INGEST_PENDING,
    LOG_LINES,
    PHASE_CHANGED,
    PHASES,
    PROJECTED_TYPES,
    STAGING_STEP,
    SUBMITTED,
    TERMINAL_PHASES,
    Checkpoint,
    LogLine,
    NewEvent,
    RecordedEvent,
    RunStatus,
)

__all__ = [
    "EventStore",
    "NewEvent",
    "RecordedEvent",
    "RunStatus",
    "LogLine",
    "LogBlock",
    "Checkpoint",
    "PHASES",
    "TERMINAL_PHASES",
    "PROJECTED_TYPES",
    "SUBMITTED",
    "PHASE_CHANGED",
    "HANDLE_RECORDED",
    "LOG_LINES",
    "LOG_INGEST_PENDING",
    "LOG_INGEST_DONE",
    "CANCEL_REQUESTED",
    "STAGING_STEP",
    "split_lines",
    "split_block",
    "split_text",
    "MAX_LINE_BYTES",
    "SCHEMA_VERSION",
    "StoreError",
    "StoreOpenError",
    "NotADatabaseError",
    "SchemaTooNewError",
    "ConcurrencyError",
    "StorageFullError",
    "StoreLockedError",
    "StoreClosedError",
]
