"""jobsup's event store: an append-only event log in one SQLite file, with
run-status and log-line projections and race-free subscriptions.

Entry point: ``store = await EventStore.open(path)``. Event types and their
``data`` shapes are in :mod:`store.types`; errors in :mod:`store.errors`.
Importing ``store`` (or ``store.types``) loads neither the engine nor
aiosqlite: :class:`EventStore` is imported on first use.
"""

from typing import TYPE_CHECKING, Any

from store.errors import (
    ConcurrencyError,
    LogArchiveError,
    LogTextDeletedError,
    NotADatabaseError,
    SchemaTooNewError,
    StorageFullError,
    StoreClosedError,
    StoreError,
    StoreLockedError,
    StoreOpenError,
)
from store.logblocks import LogBlock, skip_offset
from store.logsplit import MAX_LINE_BYTES, split_block, split_lines, split_text
from store.types import (
    CANCEL_REQUESTED,
    HANDLE_RECORDED,
    INITIAL_PHASE,
    LOG_INGEST_DONE,
    LOG_INGEST_PENDING,
    LOG_LINES,
    LOGS_ARCHIVED,
    LOGS_DELETED,
    OUTPUTS_RECORDED,
    PHASE_CHANGED,
    PHASE_RANK,
    PHASES,
    PROGRESS,
    PROJECTED_TYPES,
    STAGING_STEP,
    SUBMITTED,
    SWEEP_SUBMITTED,
    TERMINAL_PHASES,
    Append,
    Checkpoint,
    LogLine,
    NewEvent,
    RecordedEvent,
    RunStatus,
    StoreStatistics,
)

__all__ = [
    "CANCEL_REQUESTED",
    "HANDLE_RECORDED",
    "INITIAL_PHASE",
    "LOGS_ARCHIVED",
    "LOGS_DELETED",
    "LOG_INGEST_DONE",
    "LOG_INGEST_PENDING",
    "LOG_LINES",
    "MAX_LINE_BYTES",
    "OUTPUTS_RECORDED",
    "PHASES",
    "PHASE_CHANGED",
    "PHASE_RANK",
    "PROGRESS",
    "PROJECTED_TYPES",
    "SCHEMA_VERSION",
    "STAGING_STEP",
    "SUBMITTED",
    "SWEEP_SUBMITTED",
    "TERMINAL_PHASES",
    "Append",
    "Checkpoint",
    "ConcurrencyError",
    "EventStore",
    "LogArchiveError",
    "LogBlock",
    "LogLine",
    "LogTextDeletedError",
    "NewEvent",
    "NotADatabaseError",
    "RecordedEvent",
    "RunStatus",
    "SchemaTooNewError",
    "StorageFullError",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "StoreOpenError",
    "StoreStatistics",
    "skip_offset",
    "split_block",
    "split_lines",
    "split_text",
]

if TYPE_CHECKING:
    from store.eventstore import EventStore
    from store.schema import SCHEMA_VERSION

#: Names imported on first use (PEP 562): the engine loads aiosqlite,
#: anyio and structlog, which a reader of the value types (the CLI, through
#: the API's wire types) has no use for.
_LAZY = {"EventStore": "store.eventstore", "SCHEMA_VERSION": "store.schema"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
