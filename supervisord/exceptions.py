"""Every exception jobsup raises on purpose, in one place.

Hierarchy::

    JobsupError                     any jobsup error; ``str()`` is the user message
    ├── UsageError                  bad input: a flag, a file, a value (CLI exit 2)
    │   ├── TaskError               a task YAML or task flag is invalid
    │   ├── ConfigError             a config layer or the merged config is invalid
    │   ├── SourceError             git: not a repository, unknown revision, ...
    │   └── ManifestError           the Kubernetes manifest breaks the contract
    ├── RunNotFoundError            no run matches an id or prefix
    ├── AmbiguousRunError           a prefix matches several runs
    ├── RunInFlightError            a project+name already has a run in flight
    ├── BackendError                a backend failed to do what was asked
    │   ├── PreflightError          a Kubernetes preflight check failed
    │   └── KubernetesApiError      the Kubernetes API answered a request with an error Status
    ├── DaemonError                 the daemon cannot start (socket, config, ...)
    └── DaemonUnreachableError      the CLI cannot reach a daemon (exit 69)

    store.errors.StoreError         (re-exported here) event-store failures:
    ├── StoreOpenError
    │   ├── NotADatabaseError
    │   └── SchemaTooNewError
    ├── ConcurrencyError
    ├── StorageFullError
    ├── StoreLockedError
    └── StoreClosedError

Errors that cross the API travel as ``{"error": {"type": <class name>,
"message": ...}}`` with a matching HTTP status, and the client raises the same
class again.
"""

from __future__ import annotations

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

__all__ = [
    "JobsupError",
    "UsageError",
    "TaskError",
    "ConfigError",
    "SourceError",
    "ManifestError",
    "RunNotFoundError",
    "AmbiguousRunError",
    "RunInFlightError",
    "BackendError",
    "PreflightError",
    "KubernetesApiError",
    "DaemonError",
    "DaemonUnreachableError",
    "StoreError",
    "StoreOpenError",
    "NotADatabaseError",
    "SchemaTooNewError",
    "ConcurrencyError",
    "StorageFullError",
    "StoreLockedError",
    "StoreClosedError",
]


class JobsupError(Exception):
    """Base class of jobsup's own errors; ``str(err)`` is meant for the user."""


class UsageError(JobsupError):
    """Bad input from the user: a flag, a file or a value. Names what is at fault."""


class TaskError(UsageError):
    """A task YAML file or task flag is invalid."""


class ConfigError(UsageError):
    """A config layer or the merged config is invalid.

    ``errors`` holds every problem found (one line each), so that
    ``jobsup config validate`` can report them all at once.
    """

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        self.errors = errors if errors is not None else [message]
        super().__init__(message)


class SourceError(UsageError):
    """The task's git source cannot be snapshotted (not a repo, bad revision...)."""


class ManifestError(UsageError):
    """The Kubernetes manifest breaks the run contract.

    ``errors`` lists every violation found, each naming the object (kind/name).
    """

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        self.errors = errors if errors is not None else [message]
        super().__init__(message)


class RunNotFoundError(JobsupError):
    """No run has this id or id prefix."""


class AmbiguousRunError(JobsupError):
    """An id prefix matches more than one run."""


class RunInFlightError(JobsupError):
    """A run with the same project and name is still in flight (use --force)."""


class BackendError(JobsupError):
    """A backend could not do what was asked."""


class PreflightError(BackendError):
    """A preflight check failed; ``problems`` lists one line per failure."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = problems if problems is not None else [message]
        super().__init__(message)


class KubernetesApiError(BackendError):
    """The Kubernetes API answered with an error ``Status`` (or could not be
    reached: ``status`` 0).

    ``status``: the HTTP status code; ``reason``: the Status reason
    (``NotFound``, ``AlreadyExists``, ``Forbidden``, ``Invalid``...; see
    k8s.io/apimachinery metav1.StatusReason); ``retry_after_s``: the
    server's ``Retry-After`` in seconds, if it sent one; ``str(err)`` is the
    API's message prefixed with what jobsup was doing.
    """

    def __init__(
        self, message: str, *, status: int, reason: str, body: object = None, retry_after_s: float | None = None
    ) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        self.retry_after_s = retry_after_s
        super().__init__(message)


class DaemonError(JobsupError):
    """The daemon cannot start or keep running (socket, config, store)."""


class DaemonUnreachableError(JobsupError):
    """No daemon answers on the API socket (``jobsup wait`` exits 69)."""
