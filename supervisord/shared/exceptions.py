"""Every exception jobsup raises on purpose, in one place (the httpx layout:
one module, the tree drawn here, a mapping helper for the layer below).

Each class says what it means at the boundaries (kopf's errors by status,
httpx's tree): ``http_status``, the status of the API's answer (and of the
web page's), and ``exit_code``, the CLI's exit status after its one
``error:`` line. A subclass inherits both unless it sets its own.

Hierarchy (HTTP status on the API in brackets; CLI exit code in braces)::

    JobsupError                     any jobsup error; str() is the user message,
    │                               .errors one line per problem           [500] {1}
    ├── UsageError                  bad input: a flag, a file, a value     [400] {2}
    │   ├── TaskError               a task YAML or task flag is invalid
    │   ├── ConfigError             a config layer or the merged config is invalid
    │   │   └── UiConfigError       the daemon config asks for the page where it
    │   │                           may not be served (ui.host without TLS)
    │   ├── SourceError             git: not a repository, unknown revision, ...
    │   └── ManifestError           the Kubernetes manifest breaks the contract
    ├── RunNotFoundError            no run matches an id or prefix         [404]
    ├── AmbiguousRunError           a prefix matches several runs          [409]
    ├── RunInFlightError            a project+name already has a run in flight [409]
    ├── UnsafePathError             a folder or socket jobsup would trust belongs
    │                               to another user or others can write it
    ├── BackendError                a backend failed; .run_reason is what the
    │   │                           run records (default "BackendError")   [502]
    │   ├── PreflightError          a preflight check failed               [424]
    │   │   └── PreflightConfigError    ...because of the user's own config or
    │   │                               input (kubeconfig, context, namespace,
    │   │                               the manifest's values); also a
    │   │                               ConfigError, so bad input           {2}
    │   ├── RunFailed               a backend ended a run's start with the run's
    │   │                           own reason (``reason`` = ``run_reason``)
    │   ├── StagingError            the source could not be staged into the pod
    │   │                           (``reason``, default StagingFailed)
    │   └── KubernetesApiError      base of every Kubernetes API error (.status,
    │                               .reason = the API Status reason, never the
    │                               run's reason); the Kubernetes backend
    │                               subclasses it by status
    ├── StorageError                the event store failed while serving (disk
    │   │                           full, locked, closed); nothing was
    │   │                           recorded; .store_error names the store's
    │   │                           class                                  [503]
    │   └── LogsDamagedError        a run's log archive is missing, not to be
    │                               trusted (another user's, writable by
    │                               others) or not the file that was archived
    │                               (digest): nothing was read; a retry gets
    │                               the same answer                        [500]
    ├── LogsDeletedError            the run's log text was deleted on purpose
    │                               (``jobsup prune --delete-archives``, a
    │                               LogsDeleted event); not a failure, no retry [410]
    ├── DaemonError                 the daemon cannot start (socket, lock, store)
    ├── OutputError                 the CLI cannot write its output (disk full,
    │                               I/O error; a closed pipe is not one)       {1}
    ├── DaemonUnreachableError      the CLI cannot reach a daemon                {69}
    │   └── DaemonStoppingError     the daemon stopped before it finished the
    │                               request (its stop grace ran out)       [503]
    └── RemoteError                 the daemon answered with an error type this
                                    client does not know (.remote_type, .http_status)

    store.errors.StoreError         the event store's own tree (store knows
    ├── StoreOpenError              nothing of jobsup); never crosses a boundary
    │   ├── NotADatabaseError       as itself:
    │   └── SchemaTooNewError         daemon start: StoreOpenError -> DaemonError
    ├── ConcurrencyError              API handlers:  StoreError -> StorageError
    ├── StorageFullError              (:func:`map_store_errors`; the original is
    ├── StoreLockedError              the new error's ``__cause__``), except
    ├── StoreClosedError              LogTextDeletedError -> LogsDeletedError,
    ├── LogArchiveError               LogArchiveError -> LogsDamagedError
    └── LogTextDeletedError

Every error crosses the API as ``{"error": {"type", "message", "errors", ...}}``
(:mod:`supervisord.shared.wire`, ``to_wire``/``from_wire``) and the client
raises the same class again, with the same attributes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Self

__all__ = [
    "AmbiguousRunError",
    "BackendError",
    "ConfigError",
    "DaemonError",
    "DaemonStoppingError",
    "DaemonUnreachableError",
    "JobsupError",
    "KubernetesApiError",
    "LogsDamagedError",
    "LogsDeletedError",
    "ManifestError",
    "OutputError",
    "PreflightConfigError",
    "PreflightError",
    "RemoteError",
    "RunFailed",
    "RunInFlightError",
    "RunNotFoundError",
    "SourceError",
    "StagingError",
    "StorageError",
    "TaskError",
    "UiConfigError",
    "UnsafePathError",
    "UsageError",
    "map_store_errors",
]


class JobsupError(Exception):
    """Base class of jobsup's own errors.

    ``str(err)`` is the user message; ``errors`` lists every problem, one
    line each (``[message]`` when there is only one), so that a command can
    report them all at once. :meth:`wire_fields` names the extra attributes
    that cross the API (keyword arguments of ``__init__``).
    """

    #: Extra constructor keywords that travel on the wire (JSON values).
    wire_attrs: ClassVar[tuple[str, ...]] = ()
    #: The HTTP status of the API's (and the page's) answer with this error.
    http_status: int = 500
    #: The CLI's exit status after it printed this error.
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        self.errors: list[str] = list(errors) if errors else [message]
        super().__init__(message)

    def wire_fields(self) -> dict[str, Any]:
        """The extra attributes of this error as JSON values (``wire_attrs``)."""
        return {name: getattr(self, name) for name in self.wire_attrs}

    @classmethod
    def from_wire_fields(cls, message: str, errors: list[str] | None, fields: dict[str, Any]) -> JobsupError:
        """The error again from what crossed the API: its message, errors
        and ``wire_attrs`` (those present in ``fields``). A class whose
        constructor takes other arguments overrides this."""
        return cls(message, errors, **fields)


class UsageError(JobsupError):
    """Bad input from the user: a flag, a file or a value. Names what is at fault."""

    http_status = 400
    exit_code = 2


class TaskError(UsageError):
    """A task YAML file or task flag is invalid."""


class ConfigError(UsageError):
    """A config layer or the merged config is invalid; ``errors`` holds every
    problem found, so that ``jobsup config validate`` reports them all."""

    @classmethod
    def of(cls, errors: Sequence[str], what: str = "config errors") -> Self:
        """The error for every problem in ``errors`` (one or more): the
        message is the problem when there is one, else ``"N <what>:"`` and
        a ``"  - <problem>"`` line for each (``what``: ``config errors``,
        ``hook config errors``, ``config conflicts``...)."""
        items = list(errors)
        if len(items) == 1:
            return cls(items[0], items)
        return cls(f"{len(items)} {what}:\n" + "\n".join(f"  - {e}" for e in items), items)


class SourceError(UsageError):
    """The task's git source cannot be snapshotted (not a repo, bad revision...)."""


class ManifestError(UsageError):
    """The Kubernetes manifest breaks the run contract; ``errors`` lists every
    violation, each naming the object (kind/name)."""


class UiConfigError(ConfigError):
    """The daemon config asks for the web page somewhere it may not be
    served: a ``ui.host`` that is not a loopback address, without
    ``ui.tls_cert`` and ``ui.tls_key``. The daemon refuses to start."""


class RunNotFoundError(JobsupError):
    """No run has this id or id prefix."""

    http_status = 404
    exit_code = 2


class AmbiguousRunError(JobsupError):
    """An id prefix matches more than one run."""

    http_status = 409
    exit_code = 2


class RunInFlightError(JobsupError):
    """A run with the same project and name is still in flight (use --force)."""

    http_status = 409


class UnsafePathError(JobsupError):
    """A folder or socket jobsup would trust belongs to another user or can
    be written by others; ``str()`` names it and says how to fix it."""


class BackendError(JobsupError):
    """A backend could not do what was asked.

    ``run_reason``: the reason (one CamelCase word, README "Phases and
    reasons") the run records when this error ends it; ``BackendError`` by
    default. It is never taken from anything else (a Kubernetes Status
    reason such as ``NotFound`` is not a run's reason).
    """

    wire_attrs: ClassVar[tuple[str, ...]] = ("run_reason",)
    http_status = 502

    def __init__(self, message: str, errors: list[str] | None = None, *, run_reason: str = "BackendError") -> None:
        super().__init__(message, errors)
        self.run_reason = run_reason


class PreflightError(BackendError):
    """A preflight check failed; ``errors`` (alias ``problems``) lists one
    line per failure."""

    http_status = 424

    def __init__(self, message: str, problems: list[str] | None = None, *, run_reason: str = "BackendError") -> None:
        super().__init__(message, problems, run_reason=run_reason)

    @property
    def problems(self) -> list[str]:
        """The failures, one line each (the same list as ``errors``)."""
        return self.errors


class PreflightConfigError(PreflightError, ConfigError):
    """A preflight check failed because of the user's own config or input,
    not because of the backend's system: a kubeconfig that is missing or
    does not parse, a context it does not have, a namespace the credentials
    may not use, an object or kind the manifest names that the cluster does
    not have. Each line names the file or key to fix. Bad input: the CLI
    exits 2 (a ConfigError), while a PreflightError of the system itself (an
    API server that does not answer, a 5xx) exits 1."""

    http_status = 424
    exit_code = 2


class RunFailed(BackendError):
    """A backend could not start a run, and says which reason the run
    records (one CamelCase word): ``reason``, the same as ``run_reason``."""

    def __init__(self, message: str, reason: str, errors: list[str] | None = None) -> None:
        super().__init__(message, errors, run_reason=reason)
        self.reason = reason

    @classmethod
    def from_wire_fields(cls, message: str, errors: list[str] | None, fields: dict[str, Any]) -> JobsupError:
        """The error again from the wire (its ``run_reason`` is its reason)."""
        return cls(message, str(fields.get("run_reason") or "BackendError"), errors)


class StagingError(BackendError):
    """The source could not be staged into the run's pod (the message says
    why); ``reason`` is the reason the run records when this ends its start
    (default ``StagingFailed``; the Kubernetes backend raises it again as a
    :class:`RunFailed` with that reason)."""

    wire_attrs: ClassVar[tuple[str, ...]] = ("run_reason", "reason")

    def __init__(self, message: str, reason: str = "StagingFailed", errors: list[str] | None = None) -> None:
        super().__init__(message, errors)
        self.reason = reason

    @classmethod
    def from_wire_fields(cls, message: str, errors: list[str] | None, fields: dict[str, Any]) -> JobsupError:
        """The error again from the wire (``reason`` as sent)."""
        return cls(message, str(fields.get("reason") or "StagingFailed"), errors)


class KubernetesApiError(BackendError):
    """The Kubernetes API answered with an error ``Status`` (or could not be
    reached: ``status`` 0). The base class of the Kubernetes backend's API
    errors, which subclass it by HTTP status.

    ``status``: the HTTP status code; ``reason``: the Status reason
    (``NotFound``, ``AlreadyExists``, ``Forbidden``, ``Invalid``...; see
    k8s.io/apimachinery metav1.StatusReason), which is not the run's reason
    (``run_reason`` stays ``BackendError``); ``retry_after_s``: the server's
    ``Retry-After`` in seconds, if it sent one; ``body``: the parsed Status
    (kept in the daemon: it does not cross the API); ``str(err)`` is the API's
    message prefixed with what jobsup was doing.
    """

    wire_attrs: ClassVar[tuple[str, ...]] = ("run_reason", "status", "reason", "retry_after_s")

    def __init__(
        self,
        message: str,
        errors: list[str] | None = None,
        *,
        status: int,
        reason: str,
        body: object = None,
        retry_after_s: float | None = None,
        run_reason: str = "BackendError",
    ) -> None:
        super().__init__(message, errors, run_reason=run_reason)
        self.status = status
        self.reason = reason
        self.body = body
        self.retry_after_s = retry_after_s


class StorageError(JobsupError):
    """The event store failed while the daemon served a request (disk full,
    database locked past the busy timeout, store closed); nothing was
    recorded. ``store_error``: the store's class name (``StorageFullError``,
    ``StoreLockedError``...). Raised by :func:`map_store_errors`."""

    wire_attrs: ClassVar[tuple[str, ...]] = ("store_error",)
    http_status = 503

    def __init__(self, message: str, errors: list[str] | None = None, *, store_error: str = "StoreError") -> None:
        super().__init__(message, errors)
        self.store_error = store_error


class LogsDamagedError(StorageError):
    """A run's archived log text cannot be read: its archive file under
    ``<state dir>/archive/`` is missing, unreadable, not to be trusted
    (another user's, or writable by group or others) or does not match the
    sha256 its ``LogsArchived`` event recorded. The message names the file
    (and both digests on a mismatch); nothing was read from it. Not a
    transient fault: a retry gets the same answer until the file is put
    right (HTTP 500; the CLI exits 1). ``store_error`` is
    ``"LogArchiveError"``. Raised by :func:`map_store_errors` for
    :class:`store.errors.LogArchiveError`."""

    http_status = 500

    def __init__(self, message: str, errors: list[str] | None = None, *, store_error: str = "LogArchiveError") -> None:
        super().__init__(message, errors, store_error=store_error)


class LogsDeletedError(JobsupError):
    """A run's log text was deleted on purpose by retention (``jobsup prune
    --delete-archives`` recorded a ``LogsDeleted`` event); the message says
    which lines, when, the event seq and the digest the text had
    (``run <id>: its log text (lines 1..N) was deleted at T by prune
    (LogsDeleted, event seq S, sha256:...)``). Not a store failure: a
    retry gets the same answer (HTTP 410 Gone; the CLI exits 1). Raised by
    :func:`map_store_errors` for :class:`store.errors.LogTextDeletedError`."""

    http_status = 410


class DaemonError(JobsupError):
    """The daemon cannot start or keep running (socket, lock, config, store)."""


class OutputError(JobsupError):
    """The CLI cannot write its output: stdout (or stderr) fails with an
    OSError other than a closed pipe (``jobsup runs > /dev/full``: disk
    full, an I/O error). The message is ``cannot write output: <reason>``;
    the CLI exits 1. A reader that went away (EPIPE) is not an error."""


class DaemonUnreachableError(JobsupError):
    """No daemon answers on the API socket (``jobsup wait`` exits 69)."""

    exit_code = 69


class DaemonStoppingError(DaemonUnreachableError):
    """The daemon was stopping and cancelled this request when its grace
    period ran out (:class:`supervisord.daemon.api.inflight.InFlight`, HTTP 503).
    A DaemonUnreachableError to clients: whatever the request had done so
    far stays recorded, and the next daemon has the answer (a submit is
    looked up there by its request id)."""

    http_status = 503


class RemoteError(JobsupError):
    """The daemon answered with an error this client cannot rebuild: an
    unknown ``type`` (a newer daemon), or a body that is not jobsup's error
    shape. ``remote_type``: the wire type name (or ``""``); ``http_status``:
    the HTTP status. Handled like any JobsupError (exit 1)."""

    wire_attrs: ClassVar[tuple[str, ...]] = ("remote_type", "http_status")

    def __init__(
        self, message: str, errors: list[str] | None = None, *, remote_type: str = "", http_status: int = 500
    ) -> None:
        super().__init__(message, errors)
        self.remote_type = remote_type
        self.http_status = http_status


#: What each store error means to a user, and what to do.
_STORE_HINTS: dict[str, str] = {
    "StorageFullError": "the disk holding the jobsup database is full; free space and retry",
    "StoreLockedError": "another process keeps the jobsup database locked; retry shortly",
    "StoreClosedError": "the daemon's event store is closed (the daemon is stopping); retry",
    "ConcurrencyError": "the run changed meanwhile; retry",
}


@contextlib.contextmanager
def map_store_errors(what: str) -> Iterator[None]:
    """Re-raise any :class:`store.errors.StoreError` raised inside as a
    :class:`StorageError` (``"<what>: <store message> (<hint>)"``), with the
    store's error as ``__cause__``; a
    :class:`store.errors.LogTextDeletedError` (text deleted on purpose, not
    a failure) becomes a :class:`LogsDeletedError`, and a
    :class:`store.errors.LogArchiveError` (a damaged or untrusted archive,
    not a transient fault) a :class:`LogsDamagedError`, each with the
    store's message as is (no ``what`` prefix: it names the run and file). The boundary helper of the API handlers;
    the daemon start maps store open errors to DaemonError itself."""
    from store.errors import LogArchiveError, LogTextDeletedError, StoreError

    try:
        yield
    except LogTextDeletedError as err:
        raise LogsDeletedError(str(err)) from err
    except LogArchiveError as err:
        raise LogsDamagedError(str(err)) from err
    except StoreError as err:
        name = type(err).__name__
        hint = _STORE_HINTS.get(name)
        message = f"{what}: {err}" + (f" ({hint})" if hint else "")
        raise StorageError(message, store_error=name) from err
