"""The daemon's HTTP API (starlette), served on the Unix socket by uvicorn.

Routes and shapes are documented in :mod:`supervisord.api.wire`. Only the
daemon's own user may connect: :class:`PeerCredProtocol` checks
``SO_PEERCRED`` on every new connection and drops any other uid.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from json.encoder import encode_basestring as _json_str  # what json.dumps(str, ensure_ascii=False) uses
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from store import PHASE_CHANGED, PHASES, TERMINAL_PHASES, EventStore, LogLine, RunStatus
from supervisord.api.logs_route import logs_response
from supervisord.api.scheduler_routes import scheduler_routes
from supervisord.api.wire import API_PREFIX, encode_error
from supervisord.health import storage_json
from supervisord.exceptions import JobsupError, UsageError
from supervisord.scheduler.driver import Scheduler
from supervisord.submit import Planner, SubmitRequest
from supervisord.supervisor import PHASE_RANK, Supervisor

__all__ = ["create_app", "PeerCredProtocol"]

log = structlog.get_logger("jobsup.api")

_HEARTBEAT_S = 5.0
#: The hook outcome events `show` lists (supervisord.hooks.delivery).
_HOOK_OUTCOMES = ("HookDelivered", "HookFailed")
_NDJSON = "application/x-ndjson"


class PeerCredProtocol(H11Protocol):
    """uvicorn's h11 protocol, refusing peers whose uid is not the daemon's
    (``SO_PEERCRED``, unix(7))."""

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                log.warning("refused connection", peer_uid=uid)
                # Let uvicorn register the connection, then close it before
                # any byte is read (data_received only runs after this returns).
                super().connection_made(transport)
                transport.close()
                return
            # Who is asking, for the requests of this connection to record.
            self.app = _with_peer(self.app, {"uid": uid, "pid": _pid})
        super().connection_made(transport)


#: The ASGI scope key holding the peer's ``{"uid", "pid"}`` (SO_PEERCRED).
PEER_SCOPE_KEY = "jobsup.peer"


def _with_peer(app: Any, peer: dict[str, int]) -> Any:
    """``app`` with ``scope["jobsup.peer"] = peer`` on every request."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, PEER_SCOPE_KEY: peer}, receive, send)

    return wrapped


def _peer(request: Request) -> dict[str, int]:
    """The requesting process's ``{"uid", "pid"}`` ({} when not over the Unix socket)."""
    return dict(request.scope.get(PEER_SCOPE_KEY) or {})


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _log_line_json(line: LogLine) -> str:
    """``{"line_no":N,"stream":S,"text":T}`` and a newline: the same text as
    :func:`_dumps` of that dict gives, without building a JSON encoder for
    each line (a replay sends millions; this is ~3x cheaper)."""
    return f'{{"line_no":{line.line_no:d},"stream":{_json_str(line.stream)},"text":{_json_str(line.text)}}}\n'


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").lower() in ("1", "true", "yes")


#: The largest value an integer query parameter may have: SQLite's INTEGER
#: (a signed 64-bit number).
_INT_MAX = 2**63 - 1


def _int(request: Request, name: str, default: int | None = None, *, minimum: int = 0) -> int | None:
    """Query parameter ``name`` as a whole number in ``minimum..2^63-1``
    (every integer parameter is a count, a cursor or a limit), or
    ``default`` when absent. Raises UsageError (HTTP 400) naming it, before
    any response starts."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"query parameter {name}={raw[:40]!r} must be an integer") from None
    if not minimum <= value <= _INT_MAX:
        raise UsageError(f"query parameter {name}={raw[:40]!r} must be in {minimum}..{_INT_MAX}")
    return value


def _float(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"query parameter {name}={raw[:40]!r} must be a number") from None
    if not 0 <= value < float("inf"):
        raise UsageError(f"query parameter {name}={raw[:40]!r} must be a finite number, not negative")
    return value


Handler = Callable[[Request], Awaitable[Response]]


def _errors(fn: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except JobsupError as err:
            status, body = encode_error(err)
            return JSONResponse(body, status_code=status)
        except Exception as err:
            log.exception("request failed", path=request.url.path)
            status, body = encode_error(err)
            return JSONResponse(body, status_code=status)

    return wrapped


def create_app(
    *,
    supervisor: Supervisor,
    planner: Planner,
    store: EventStore,
    info: dict[str, Any],
    doctor: Callable[[], Awaitable[list[dict[str, Any]]]],
    scheduler: Scheduler | None = None,
    ui: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
    hooks: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
) -> Starlette:
    """Build the API application over a running supervisor and store (and
    the scheduler, whose routes it adds when given). ``hooks`` lists the
    hooks with their checkpoints (``GET /v1/hooks``)."""

    async def health(request: Request) -> Response:
        return JSONResponse(
            {"ok": True, **info, "supervised": supervisor.supervised(), "storage": storage_json(store)}
        )

    async def submit(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            raise UsageError("submit: the request body is not JSON") from None
        req = SubmitRequest.from_json(body)
        plan = await planner.plan(req)
        peer = _peer(request)
        submitted = {**plan.submitted, **{f"submitted_by_{k}": v for k, v in peer.items()}}
        submitted = await scheduler.prepare(submitted) if scheduler is not None else submitted
        run = await supervisor.submit(submitted, env=plan.env, config=plan.config, force=plan.force)
        return JSONResponse({"run": run.to_json(), "warnings": plan.warnings}, status_code=201)

    async def list_runs(request: Request) -> Response:
        phase = request.query_params.get("phase")
        if phase and phase.upper() not in PHASES:
            raise UsageError(f"--phase {phase!r}: use one of {', '.join(PHASES)}")
        runs = await store.list_runs(
            project=request.query_params.get("project") or None,
            phases=[phase.upper()] if phase else None,
        )
        if not _flag(request, "all") and not phase:
            recent = {r.id for r in runs[:20]}
            runs = [r for r in runs if not r.terminal or r.id in recent]
        return JSONResponse({"runs": [r.to_json() for r in runs], "storage": storage_json(store)})

    async def show(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        run = await supervisor.get(run_id)
        first = await store.read_all(0, limit=1, run_id=run_id)  # Submitted, not the whole stream
        hooks = await store.read_all(0, limit=1000, run_id=run_id, types=_HOOK_OUTCOMES)
        return JSONResponse(
            {"run": run.to_json(), "submitted": first[0].data if first else {}, "hooks": [e.to_json() for e in hooks]}
        )

    async def cancel(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        run = await supervisor.cancel(run_id, requested_by=_peer(request))
        return JSONResponse({"run": run.to_json()})

    async def logs(request: Request) -> Response:
        return await logs_response(request, supervisor, store)

    async def wait(request: Request) -> Response:
        refs = [r for r in request.query_params.getlist("run") if r]
        if not refs:
            raise UsageError("wait: name at least one run")
        run_ids = [await supervisor.resolve(r) for r in refs]
        cond = (request.query_params.get("for") or "terminal").strip()
        if cond not in ("terminal", "change") and cond.upper() not in PHASES:
            raise UsageError(f"--for {cond!r}: use terminal, change, or a phase ({', '.join(PHASES)})")
        after = _int(request, "after")
        timeout = _float(request, "timeout")
        # Validate every run exists before streaming anything.
        for rid in run_ids:
            await supervisor.get(rid)

        async def stream() -> AsyncIterator[bytes]:
            start_seq = after if after is not None else await store.last_seq()
            # Tell the client its cursor, so it can resume after a reconnect.
            yield _dumps({"after": start_seq})
            deadline = None if timeout is None else anyio.current_time() + timeout
            while True:
                # Read the global position first: any change after it wakes
                # the wait below, even one that lands while the runs are read.
                seq = await store.last_seq()
                runs = [await supervisor.get(rid) for rid in run_ids]
                met = await _condition_met(store, cond, runs, start_seq)
                if met:
                    yield _dumps({"result": {"met": True, "timed_out": False, "runs": [r.to_json() for r in runs]}})
                    return
                remaining = None if deadline is None else deadline - anyio.current_time()
                if remaining is not None and remaining <= 0:
                    yield _dumps({"result": {"met": False, "timed_out": True, "runs": [r.to_json() for r in runs]}})
                    return
                step = _HEARTBEAT_S if remaining is None else min(_HEARTBEAT_S, remaining)
                got = await store.wait_for_events(seq, run_ids=run_ids, types=[PHASE_CHANGED], limit=1, timeout_s=step)
                if not got:
                    yield _dumps({"heartbeat": seq})

        return StreamingResponse(stream(), media_type=_NDJSON)

    async def events(request: Request) -> Response:
        ref = request.query_params.get("run")
        run_id = await supervisor.resolve(ref) if ref else None
        after = _int(request, "after", 0) or 0
        follow = _flag(request, "follow")
        limit = _int(request, "limit", 1000, minimum=1) or 1000

        async def stream() -> AsyncIterator[bytes]:
            cursor = after
            while True:
                page = await store.read_all(cursor, limit=limit, run_id=run_id)
                if page:
                    cursor = page[-1].seq
                    yield b"".join(_dumps(e.to_json()) for e in page)
                    continue
                if not follow:
                    return
                got = await store.wait_for_events(
                    cursor, run_ids=[run_id] if run_id else None, limit=1, timeout_s=_HEARTBEAT_S
                )
                if not got:
                    yield _dumps({"heartbeat": cursor})

        return StreamingResponse(stream(), media_type=_NDJSON)

    async def doctor_route(request: Request) -> Response:
        return JSONResponse({"checks": await doctor()})

    async def hooks_route(request: Request) -> Response:
        return JSONResponse({"hooks": await hooks() if hooks is not None else []})

    async def ui_route(request: Request) -> Response:
        if ui is None:
            raise UsageError("this daemon does not serve the web page")
        try:
            body = await request.json()
        except ValueError:
            raise UsageError("ui: the request body is not JSON") from None
        if not isinstance(body, dict):
            raise UsageError("ui: the request body must be a JSON object")
        return JSONResponse(await ui(body))

    p = API_PREFIX
    routes = [
        Route(f"{p}/ui", _errors(ui_route), methods=["POST"]),
        Route(f"{p}/health", _errors(health), methods=["GET"]),
        Route(f"{p}/runs", _errors(submit), methods=["POST"]),
        Route(f"{p}/runs", _errors(list_runs), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}", _errors(show), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}/cancel", _errors(cancel), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/logs", _errors(logs), methods=["GET"]),
        Route(f"{p}/wait", _errors(wait), methods=["GET"]),
        Route(f"{p}/events", _errors(events), methods=["GET"]),
        Route(f"{p}/doctor", _errors(doctor_route), methods=["GET"]),
        Route(f"{p}/hooks", _errors(hooks_route), methods=["GET"]),
    ]
    if scheduler is not None:
        routes += scheduler_routes(supervisor=supervisor, scheduler=scheduler, digest_key=planner.digest_key)
    return Starlette(routes=routes)


async def _condition_met(store: EventStore, cond: str, runs: list[RunStatus], after_seq: int) -> bool:
    """Whether ``wait --for cond`` is satisfied for ``runs``.

    terminal: every run is terminal. change: any run had a PhaseChanged with
    seq > after_seq. PHASE: every run is at or past PHASE (phases never go
    backwards); for a terminal PHASE, every run is terminal (the caller's
    exit code then tells which terminal phase it was).
    """
    if cond == "terminal":
        return all(r.terminal for r in runs)
    if cond == "change":
        for r in runs:
            if await store.read_all(after_seq, limit=1, run_id=r.id, types=[PHASE_CHANGED]):
                return True
        return False
    target = cond.upper()
    if target in TERMINAL_PHASES:
        return all(r.terminal for r in runs)
    # Phases never go backwards: a run at or past the target has reached it.
    return all(PHASE_RANK[r.phase] >= PHASE_RANK[target] for r in runs)
