"""Wire types of the daemon API (HTTP/1.1 + JSON on the Unix socket, under ``/v1``).

Errors travel as ``{"error": {"type", "bases", "message", "errors", ...}}``
with the error class's ``http_status`` (:func:`to_wire`); the client
raises the same class from :mod:`supervisord.shared.exceptions` again
(:func:`from_wire`).
Streams are newline-delimited JSON (``application/x-ndjson``), one object a
line; one that fails after its headers ends with the error record
``{"error": {...}, "status": N}`` (:func:`error_record`), which the client
raises as the error (:func:`raise_error_record`).

Endpoints::

    GET  /v1/health                       {"ok": true, "pid", "version", "uid", "state_dir", "socket"}
    POST /v1/runs                         SubmitRequest -> {"run": Run, "warnings": [str]}
                                          (task.sweep: {"sweep": Sweep, "run_ids": [id], "warnings"}; sweep_routes)
    GET  /v1/runs?all=&project=&phase=&label=K=V&name=GLOB&sweep=S    {"runs": [Run]}
    GET  /v1/sweeps/{ref}[?runs=1]        the sweep document (supervisord.daemon.sweepread; schema sweep)
    POST /v1/sweeps/{ref}/cancel          {"runs": [Run]}: every run of the sweep canceled
    GET  /v1/runs/{ref}                   {"run": Run, "submitted": {...}, "hooks": [HookDelivered/HookFailed events]}
    POST /v1/runs/{ref}/cancel            {"run": Run}
    POST /v1/cancel                       {"runs": [ref]} -> {"runs": [Run]}: many runs (sweep ids: all
                                          their runs) canceled together (cancel_routes)
    POST /v1/runs/{ref}/pause             {"run": Run}   (local runs: SIGSTOP, reason Paused)
    POST /v1/runs/{ref}/resume            {"run": Run}
    GET  /v1/runs/{ref}/logs?after_line=&tail=&limit=&follow=&format=text|ndjson|blocks
                                          plain text by default; see supervisord.daemon.api.logs_route
    GET  /v1/wait?run=&for=&after=&timeout=               (run= may be a sweep id: all its runs) ndjson {"heartbeat": seq}..., then {"result": WaitResult}
    GET  /v1/events?run=&after=&follow=&limit=            ndjson RecordedEvent...
    POST /v1/ui        {"port"?: int, "stop"?: bool}   {"url", "port"} | {}
    GET  /v1/doctor                       {"checks": [{"name", "ok", "detail"}]}
    GET  /v1/queue                        {"waiting": [...], "gpus": [...], "queues": [...], "reservation", "notes"}  (scheduler_routes)
    GET  /v1/top                          {"at", "interval_s", "runs": [...], "gpus": [...], "notes": [...]}  (usage_routes)
    POST /v1/runs/{ref}/hold              {"run": Run, "warnings"?: [str] (already held)}
    POST /v1/runs/{ref}/release           {"run": Run, "warnings"?: [str] (was not held)}
    POST /v1/queues/{name}                {"max_parallel": int | null, "from_config"?: bool}
                                          -> {"queue": {name, max_parallel, source, running, waiting}, "new": bool}
    POST /v1/update                       {"runs": [ref], "priority"?, "gpus"?, "queue"?, "timeout"?}
                                          -> {"runs": [Run], "updated": {id: {"old", "new"}}}
    POST /v1/runs/{ref}/rerun             {"env", "shell_env"?, "hold", "force", ...} -> {"run": Run, "rerun_of", "missing_env"}
    GET  /v1/runs/{ref}/outputs           the run's outputs folder and files (supervisord.daemon.outputs.query)
    POST /v1/which     {"sha256": [hex]}  {"files": [{"sha256", "runs": [...]}]} (supervisord.daemon.outputs.query)
    GET  /v1/hooks                        {"hooks": [{"name", "kind", "when", "match", "target", "source",
                                            "checkpoint", "position", "lag", "delivering", "last_outcome"}],
                                           "config_changed": [str]}   (config files changed since read)
    POST /v1/daemon/stop    {"restart"?: bool}  {"pid", "supervised", "systemd"}  (then the daemon stops)
    POST /v1/daemon/reload                {"changed": [key], "hooks": {added, removed, changed}, "restart_needed"}

A ``Run`` is :meth:`store.RunStatus.to_json` (id, project, name, backend,
phase, reason, message, exit_code, created_at, updated_at, last_seq, ...).
"""

from __future__ import annotations

from typing import Any, Final

from supervisord.shared import exceptions as exc

__all__ = [
    "API_PREFIX",
    "ERROR_RECORD_KEY",
    "EXIT_UNREACHABLE",
    "EXIT_WAIT_TIMEOUT",
    "WAIT_EXIT_CODES",
    "error_record",
    "exit_code_for_phase",
    "from_wire",
    "raise_error_record",
    "to_wire",
]

API_PREFIX: Final = "/v1"

#: ``jobsup wait`` exit codes by terminal phase (README, "`jobsup wait` exit codes").
WAIT_EXIT_CODES: Final[dict[str, int]] = {"COMPLETED": 0, "ERROR": 1, "CANCELED": 3, "DELETED": 4}
EXIT_WAIT_TIMEOUT: Final = 124
EXIT_UNREACHABLE: Final = 69


def exit_code_for_phase(phase: str) -> int:
    """The ``wait`` exit code for a terminal ``phase`` (0 for non-terminal)."""
    return WAIT_EXIT_CODES.get(phase, 0)


def to_wire(err: BaseException) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, body)`` for an error raised while serving.

    Body: ``{"error": {"type": class name, "bases": [names of its jobsup
    ancestors, nearest first], "message": str, "errors": [str, ...],
    <wire_attrs>...}}``. ``errors`` is never empty (``[message]`` at least).
    An exception that is not a JobsupError (a bug) travels as type
    ``InternalError`` with status 500 and its ``repr`` as the message.
    """
    if not isinstance(err, exc.JobsupError):
        message = f"internal error in the daemon: {err!r} (the daemon log has the traceback)"
        return 500, {
            "error": {"type": "InternalError", "bases": ["JobsupError"], "message": message, "errors": [message]}
        }
    status = err.http_status
    bases = [c.__name__ for c in type(err).__mro__[1:] if issubclass(c, exc.JobsupError)]
    info: dict[str, Any] = {"type": type(err).__name__, "bases": bases, "message": str(err), "errors": list(err.errors)}
    info.update(err.wire_fields())
    return status, {"error": info}


def _known_errors() -> dict[str, type[exc.JobsupError]]:
    """Every JobsupError class imported in this process, by name."""
    found: dict[str, type[exc.JobsupError]] = {}
    todo: list[type[exc.JobsupError]] = [exc.JobsupError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found


def from_wire(status: int, body: Any) -> exc.JobsupError:
    """The exception to raise in the client for an error response.

    The class is the wire ``type`` when this process knows it, else the
    nearest of its ``bases`` that it knows (a newer daemon's subclass comes
    back as its known parent, e.g. ``KubernetesApiError``; the root
    JobsupError only counts as the type itself), built with
    ``message``, ``errors`` and the class's ``wire_attrs`` found in the body.
    When no name is known, or the body is not jobsup's error shape (a proxy,
    a crash), the result is :class:`~supervisord.shared.exceptions.RemoteError`
    carrying the type name and the HTTP status: never a silent plain
    JobsupError.
    """
    info = body.get("error") if isinstance(body, dict) else None
    if not isinstance(info, dict):
        return exc.RemoteError(f"daemon answered HTTP {status}: {body!r}"[:500], http_status=status)
    type_name = str(info.get("type") or "")
    message = str(info.get("message") or f"HTTP {status}")
    raw_errors = info.get("errors")
    errors = [str(e) for e in raw_errors] if isinstance(raw_errors, list) and raw_errors else None
    known = _known_errors()
    raw_bases = info.get("bases")
    bases = [str(b) for b in raw_bases] if isinstance(raw_bases, list) else []
    for i, name in enumerate([type_name, *bases]):
        cls = known.get(name)
        if cls is None or (i > 0 and cls is exc.JobsupError):
            continue
        fields = {k: info[k] for k in cls.wire_attrs if k in info}
        return cls.from_wire_fields(message, errors, fields)
    return exc.RemoteError(message, errors, remote_type=type_name, http_status=status)


#: The key of the error record that ends an NDJSON stream whose error came
#: after its headers (:mod:`supervisord.daemon.api.boundary`): no other line of
#: the ``logs``, ``events`` or ``wait`` streams has it.
ERROR_RECORD_KEY: Final = "error"


def error_record(err: BaseException) -> dict[str, Any]:
    """The last line of an NDJSON stream that failed after its headers:
    :func:`to_wire`'s body plus the HTTP status the error would have had
    before them, ``{"error": {"type", "bases", "message", "errors", ...},
    "status": N}``."""
    status, body = to_wire(err)
    return {**body, "status": status}


def raise_error_record(obj: Any) -> None:
    """Raise the error an NDJSON stream's line carries
    (:func:`error_record`, rebuilt by :func:`from_wire`); return for any
    other line."""
    if isinstance(obj, dict) and ERROR_RECORD_KEY in obj:
        status = obj.get("status")
        raise from_wire(status if isinstance(status, int) else 500, obj)
