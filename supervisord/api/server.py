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
from collections.abc import AsyncIterator, Awaitable, Callable
from json.encoder import encode_basestring as _json_str  # what json.dumps(str, ensure_ascii=False) uses
from typing import Any

import anyio
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from store import EventStore, LogLine
from supervisord.api.boundary import api_errors
from supervisord.api.logs_route import logs_response
from supervisord.api.query import flag_param, float_param, int_param
from supervisord.api.scheduler_routes import scheduler_routes
from supervisord.api.streams import StreamCloser
from supervisord.api.sweep_routes import is_sweep_request, label_params, submit_sweep, sweep_routes
from supervisord.api.wire import API_PREFIX
from supervisord.exceptions import UsageError
from supervisord.health import output_space, storage_json
from supervisord.readside import ReadSide
from supervisord.retention import Retention, parse_age
from supervisord.scheduler.driver import Scheduler
from supervisord.submit import Planner, SubmitRequest
from supervisord.supervisor import Supervisor

__all__ = ["create_app", "PeerCredProtocol"]

log = structlog.get_logger("jobsup.api")

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


async def _ndjson(items: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """One NDJSON line per item."""
    async for item in items:
        yield _dumps(item)


async def _ndjson_pages(pages: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    """One write per page, one NDJSON line per item."""
    async for page in pages:
        yield b"".join(_dumps(item) for item in page)


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
    retention: Retention | None = None,
    streams: StreamCloser | None = None,
) -> Starlette:
    """Build the API application over a running supervisor and store (and
    the scheduler, whose routes it adds when given): writes go to the
    supervisor, reads to :class:`~supervisord.readside.ReadSide`. ``hooks``
    lists the hooks with their checkpoints (``GET /v1/hooks``); ``retention``
    answers ``POST /v1/prune``. ``streams`` ends the open streams (logs,
    wait, events) cleanly when the daemon stops
    (:class:`~supervisord.api.streams.StreamCloser`)."""
    reads = ReadSide(store)

    def ends_on_stop(
        handler: Callable[[Request], Awaitable[Response]], *, only_when_following: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler``'s stream ends cleanly when the daemon stops: only a
        stream that waits for what comes next (``wait``, ``follow=1``),
        whose client reconnects and resumes. A finite replay (``logs`` or
        ``events`` without ``follow``) is not cut cleanly: its client could
        not tell a cut from the end and would take the output as complete.
        It gets the stop's grace to finish, and is cut off (an incomplete
        response, an error to the client) only after it."""

        async def guarded(request: Request) -> Response:
            response = await handler(request)
            if only_when_following and not flag_param(request.query_params, "follow"):
                return response
            if streams is not None and isinstance(response, StreamingResponse):
                response.body_iterator = streams.guard(response.body_iterator)
            return response

        return guarded

    async def output_json() -> dict[str, Any] | None:
        running = supervisor.running_local()
        if not running:
            return None
        return await anyio.to_thread.run_sync(output_space, supervisor.paths.runs_dir, running)

    async def health(request: Request) -> Response:
        return JSONResponse(
            {
                "ok": True,
                **info,
                "supervised": supervisor.supervised(),
                "storage": storage_json(store),
                "output": await output_json(),
            }
        )

    async def submit(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            raise UsageError("submit: the request body is not JSON") from None
        req = SubmitRequest.from_json(body)
        if is_sweep_request(body):
            return await submit_sweep(req, _peer(request), planner=planner, supervisor=supervisor, scheduler=scheduler)
        plan = await planner.plan(req)
        peer = _peer(request)
        submitted = {**plan.submitted, **{f"submitted_by_{k}": v for k, v in peer.items()}}
        submitted = await scheduler.prepare(submitted) if scheduler is not None else submitted
        result = await supervisor.submit_run(submitted, env=plan.env, config=plan.config, force=plan.force)
        warnings = [*plan.warnings, *result.warnings]
        return JSONResponse({"run": result.run.to_json(), "warnings": warnings}, status_code=201)

    async def list_runs(request: Request) -> Response:
        runs = await reads.list_runs(
            all=flag_param(request.query_params, "all"),
            project=request.query_params.get("project"),
            phase=request.query_params.get("phase"),
            labels=label_params(request.query_params.getlist("label")),
            name=request.query_params.get("name") or None,
            sweep=request.query_params.get("sweep") or None,
        )
        return JSONResponse(
            {"runs": [r.to_json() for r in runs], "storage": storage_json(store), "output": await output_json()}
        )

    async def show(request: Request) -> Response:
        return JSONResponse(await reads.show(request.path_params["ref"]))

    async def cancel(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        run = await supervisor.cancel(run_id, requested_by=_peer(request))
        return JSONResponse({"run": run.to_json()})

    async def logs(request: Request) -> Response:
        return await logs_response(request, supervisor, store)

    async def wait(request: Request) -> Response:
        stream = await reads.open_wait(
            [r for r in request.query_params.getlist("run") if r],
            cond=request.query_params.get("for") or "terminal",
            after=int_param(request.query_params, "after"),
            timeout=float_param(request.query_params, "timeout"),
        )
        return StreamingResponse(_ndjson(stream), media_type=_NDJSON)

    async def events(request: Request) -> Response:
        ref = request.query_params.get("run")
        pages = reads.events(
            run_id=await reads.resolve(ref) if ref else None,
            after=int_param(request.query_params, "after", 0) or 0,
            follow=flag_param(request.query_params, "follow"),
            limit=int_param(request.query_params, "limit", 1000, minimum=1) or 1000,
        )
        return StreamingResponse(_ndjson_pages(pages), media_type=_NDJSON)

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

    async def prune_route(request: Request) -> Response:
        if retention is None:
            raise UsageError("this daemon does not prune")
        try:
            body = await request.json()
        except ValueError:
            raise UsageError("prune: the request body is not JSON") from None
        if not isinstance(body, dict):
            raise UsageError("prune: the request body must be a JSON object")
        older = parse_age(str(body.get("older_than", "")), what="--older-than", allow_zero=True)
        report = await retention.prune(
            older_than_s=older,
            run_dirs_older_than_s=older if body.get("run_dirs") else None,
            dry_run=bool(body.get("dry_run")),
            delete_archives=bool(body.get("delete_archives")),
        )
        return JSONResponse(report)

    p = API_PREFIX
    routes = [
        Route(f"{p}/prune", api_errors(prune_route), methods=["POST"]),
        Route(f"{p}/ui", api_errors(ui_route), methods=["POST"]),
        Route(f"{p}/health", api_errors(health), methods=["GET"]),
        Route(f"{p}/runs", api_errors(submit), methods=["POST"]),
        Route(f"{p}/runs", api_errors(list_runs), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}", api_errors(show), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}/cancel", api_errors(cancel), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/logs", api_errors(ends_on_stop(logs, only_when_following=True)), methods=["GET"]),
        Route(f"{p}/wait", api_errors(ends_on_stop(wait)), methods=["GET"]),
        Route(f"{p}/events", api_errors(ends_on_stop(events, only_when_following=True)), methods=["GET"]),
        Route(f"{p}/doctor", api_errors(doctor_route), methods=["GET"]),
        Route(f"{p}/hooks", api_errors(hooks_route), methods=["GET"]),
    ]
    routes += sweep_routes(supervisor=supervisor, store=store)
    if scheduler is not None:
        routes += scheduler_routes(supervisor=supervisor, scheduler=scheduler, digest_key=planner.digest_key)
    return Starlette(routes=routes)
