"""Wire types of the daemon API (HTTP/1.1 + JSON on the Unix socket, under ``/v1``).

Errors travel as ``{"error": {"type": <exception class name>, "message": str,
"errors": [str, ...]}}`` with the HTTP status of :data:`ERROR_STATUS`; the
client raises the same class from :mod:`supervisord.exceptions` again.
Streams are newline-delimited JSON (``application/x-ndjson``), one object a
line.

Endpoints::

    GET  /v1/health                       {"ok": true, "pid", "version", "uid", "state_dir", "socket"}
    POST /v1/runs                         SubmitRequest -> {"run": Run, "warnings": [str]}
    GET  /v1/runs?all=&project=&phase=    {"runs": [Run]}
    GET  /v1/runs/{ref}                   {"run": Run, "submitted": {...}, "hooks": [HookDelivered/HookFailed events]}
    POST /v1/runs/{ref}/cancel            {"run": Run}
    GET  /v1/runs/{ref}/logs?after_line=&tail=&limit=&follow=&format=text|ndjson|blocks
                                          plain text by default; see supervisord.api.logs_route
    GET  /v1/wait?run=&for=&after=&timeout=               ndjson {"heartbeat": seq}..., then {"result": WaitResult}
    GET  /v1/events?run=&after=&follow=&limit=            ndjson RecordedEvent...
    POST /v1/ui        {"port"?: int, "stop"?: bool}   {"url", "port"} | {}
    GET  /v1/doctor                       {"checks": [{"name", "ok", "detail"}]}
    GET  /v1/queue                        {"waiting": [...], "gpus": [...], "queues": [...]}  (scheduler_routes)
    POST /v1/runs/{ref}/hold              {"run": Run}
    POST /v1/runs/{ref}/release           {"run": Run}
    POST /v1/runs/{ref}/rerun             {"env", "hold", "force"} -> {"run": Run, "rerun_of", "missing_env"}
    GET  /v1/hooks                        {"hooks": [{"name", "kind", "when", "match", "target", "source",
                                            "checkpoint", "position", "lag", "delivering", "last_outcome"}]}

A ``Run`` is :meth:`store.RunStatus.to_json` (id, project, name, backend,
phase, reason, message, exit_code, created_at, updated_at, last_seq, ...).
"""

from __future__ import annotations

from typing import Any, Final

from store.types import PHASES
from supervisord import exceptions as exc

__all__ = [
    "API_PREFIX",
    "PHASES",
    "ERROR_STATUS",
    "WAIT_EXIT_CODES",
    "EXIT_WAIT_TIMEOUT",
    "EXIT_UNREACHABLE",
    "encode_error",
    "decode_error",
    "exit_code_for_phase",
]

API_PREFIX: Final = "/v1"

#: HTTP status for each error class (most specific first); anything else is 500.
ERROR_STATUS: Final[dict[type[Exception], int]] = {
    exc.RunNotFoundError: 404,
    exc.AmbiguousRunError: 409,
    exc.RunInFlightError: 409,
    exc.ConcurrencyError: 409,
    exc.PreflightError: 424,
    exc.UsageError: 400,
    exc.BackendError: 502,
}

#: ``jobsup wait`` exit codes by terminal phase (DESIGN.md).
WAIT_EXIT_CODES: Final[dict[str, int]] = {"COMPLETED": 0, "ERROR": 1, "CANCELED": 3, "DELETED": 4}
EXIT_WAIT_TIMEOUT: Final = 124
EXIT_UNREACHABLE: Final = 69


def exit_code_for_phase(phase: str) -> int:
    """The ``wait`` exit code for a terminal ``phase`` (0 for non-terminal)."""
    return WAIT_EXIT_CODES.get(phase, 0)


def encode_error(err: Exception) -> tuple[int, dict[str, Any]]:
    """``(http status, body)`` for an exception raised while serving."""
    status = 500
    for cls, code in ERROR_STATUS.items():
        if isinstance(err, cls):
            status = code
            break
    errors = getattr(err, "errors", None) or getattr(err, "problems", None) or [str(err)]
    return status, {"error": {"type": type(err).__name__, "message": str(err), "errors": list(errors)}}


def decode_error(status: int, body: Any) -> Exception:
    """The exception to raise in the client for an error response."""
    info = body.get("error") if isinstance(body, dict) else None
    if not isinstance(info, dict):
        return exc.JobsupError(f"daemon answered HTTP {status}: {body!r}"[:500])
    cls = getattr(exc, str(info.get("type")), None)
    message = str(info.get("message") or f"HTTP {status}")
    errors = info.get("errors")
    if isinstance(cls, type) and issubclass(cls, Exception):
        if cls in (exc.ConfigError, exc.ManifestError):
            return cls(message, errors=list(errors or []) or None)
        if cls is exc.PreflightError:
            return exc.PreflightError(message, problems=list(errors or []) or None)
        if cls is exc.ConcurrencyError:
            return exc.JobsupError(message)
        try:
            return cls(message)
        except TypeError:
            pass
    return exc.JobsupError(message)
