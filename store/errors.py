"""Errors raised by the event store.

Hierarchy::

    StoreError                  any failure of the event store
    ├── StoreOpenError          the file cannot be used as a jobsup database
    │   ├── NotADatabaseError   not SQLite, or corrupt (the file is left untouched)
    │   └── SchemaTooNewError   written by a newer jobsup (left untouched)
    ├── ConcurrencyError        append with a stale expected_version; nothing written
    ├── StorageFullError        the disk (or max_page_count) is full; nothing written
    ├── StoreLockedError        another process holds the write lock past the busy timeout
    └── StoreClosedError        the store was closed (or its writer died)

``supervisord.shared.exceptions`` re-exports these inside the jobsup-wide hierarchy.
"""

from __future__ import annotations

__all__ = [
    "ConcurrencyError",
    "LogArchiveError",
    "LogTextDeletedError",
    "NotADatabaseError",
    "SchemaTooNewError",
    "StorageFullError",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "StoreOpenError",
]


class StoreError(Exception):
    """Base class of every event-store error."""


class StoreOpenError(StoreError):
    """The database file cannot be opened as a jobsup event store."""


class NotADatabaseError(StoreOpenError):
    """The file is not an SQLite database or is corrupt; it was not modified."""


class SchemaTooNewError(StoreOpenError):
    """The database was written by a newer jobsup; it was not modified."""


class ConcurrencyError(StoreError):
    """An append named a stale ``expected_version``; nothing was written.

    Attributes: ``run_id``, ``expected`` (what the caller passed; None for
    an append at the end of a stream that does not exist) and
    ``actual`` (the stream's current version).
    """

    def __init__(self, run_id: str, expected: int | None, actual: int) -> None:
        super().__init__(
            f"run {run_id}: no such stream (an append at its end needs an existing run)"
            if expected is None
            else f"run {run_id}: expected stream version {expected}, but it is at {actual}"
        )
        self.run_id = run_id
        self.expected = expected
        self.actual = actual


class StorageFullError(StoreError):
    """The database could not grow (disk full); the failed batch wrote nothing."""


class StoreLockedError(StoreError):
    """Another process kept the database write-locked past the busy timeout."""


class StoreClosedError(StoreError):
    """The store is closed; no more appends or reads are possible."""


class LogArchiveError(StoreError):
    """A run's archived log text cannot be read as recorded: its archive
    file is missing, unreadable, or differs from the sha256 its
    ``LogsArchived`` event recorded. Nothing of it is returned."""


class LogTextDeletedError(StoreError):
    """A run's log text was deleted by retention (a ``LogsDeleted`` event:
    the message says when and the digest the text had)."""
