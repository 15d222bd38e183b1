"""The daemon's HTTP API (starlette), served on the Unix socket by uvicorn.

Routes and shapes are documented in :mod:`supervisord.api.wire`. Only the
daemon's own user may connect:
:class:`supervisord.api.uvicorn_server.PeerCredProtocol` checks
``SO_PEERCRED`` on every new connection and drops any other uid.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from store import EventStore
from supervisord.api.boundary import api_errors
from supervisord.api.cancel_routes import cancel_routes
from supervisord.api.logs_route import logs_response
from supervisord.api.query import flag_param, float_param, int_param
from supervisord.api.scheduler_routes import scheduler_routes
from supervisord.api.streams import StreamCloser
from supervisord.api.sweep_routes import is_sweep_request, label_params, submit_sweep, sweep_routes
from supervisord.api.usage_routes import usage_routes
from supervisord.api.uvicorn_server import PEER_SCOPE_KEY
from supervisord.api.wire import API_PREFIX
from supervisord.exceptions import UsageError
from supervisord.health import output_space, storage_json
from supervisord.outputs.query import run_outputs, which
from supervisord.readside import ReadSide
from supervisord.retention import Retention, parse_age
from supervisord.scheduler.driver import Scheduler
from supervisord.submit import Planner, SubmitRequest
from supervisord.supervisor import Supervisor

__all__ = ["create_app"]

log = structlog.get_logger("jobsup.api")

_NDJSON = "application/x-ndjson"


def _peer(request: Request) -> dict[str, int]:
    """The requesting process's ``{"uid", "pid"}`` ({} when not over the Unix socket)."""
    return dict(request.scope.get(PEER_SCOPE_KEY) or {})


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


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
    config_changed: Callable[[], list[str]] | None = None,
    daemon_control: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
    usage: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> Starlette:
    """Build the API application over a running supervisor and store (and
    the scheduler, whose routes it adds when given): writes go to the
    supervisor, reads to :class:`~supervisord.readside.ReadSide`. ``hooks``
    lists the hooks with their checkpoints (``GET /v1/hooks``); ``retention``
    answers ``POST /v1/prune``. ``streams`` ends the open streams (logs,
    wait, events) cleanly when the daemon stops
    (:class:`~supervisord.api.streams.StreamCloser`). ``config_changed``
    says which config files changed since the daemon read them (``GET
    /v1/hooks`` carries it); ``daemon_control`` answers ``POST
    /v1/daemon/{stop|reload}``; ``usage`` answers ``GET /v1/top`` (the
    usage sampler's live view)."""
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

    async def pause(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        return JSONResponse({"run": (await supervisor.pause(run_id, requested_by=_peer(request))).to_json()})

    async def resume(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        return JSONResponse({"run": (await supervisor.resume(run_id, requested_by=_peer(request))).to_json()})

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
        return JSONResponse(
            {
                "hooks": await hooks() if hooks is not None else [],
                "config_changed": config_changed() if config_changed is not None else [],
            }
        )

    async def daemon_route(request: Request) -> Response:
        if daemon_control is None:
            raise UsageError("this daemon cannot be controlled over the API")
        try:
            body: Any = await request.json()
        except ValueError:
            body = {}
        return JSONResponse(await daemon_control(request.path_params["action"], body if isinstance(body, dict) else {}))

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

    async def outputs(request: Request) -> Response:
        run_id = await reads.resolve(request.path_params["ref"])
        return JSONResponse(await run_outputs(store, run_id))

    async def which_route(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            raise UsageError("which: the request body is not JSON") from None
        digests = body.get("sha256") if isinstance(body, dict) else None
        if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
            raise UsageError('which: the request body must be {"sha256": [HEX, ...]}')
        return JSONResponse(await which(store, digests))

    p = API_PREFIX
    routes = [
        Route(f"{p}/runs/{{ref}}/outputs", api_errors(outputs), methods=["GET"]),
        Route(f"{p}/which", api_errors(which_route), methods=["POST"]),
        Route(f"{p}/prune", api_errors(prune_route), methods=["POST"]),
        Route(f"{p}/ui", api_errors(ui_route), methods=["POST"]),
        Route(f"{p}/health", api_errors(health), methods=["GET"]),
        Route(f"{p}/runs", api_errors(submit), methods=["POST"]),
        Route(f"{p}/runs", api_errors(list_runs), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}", api_errors(show), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}/cancel", api_errors(cancel), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/pause", api_errors(pause), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/resume", api_errors(resume), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/logs", api_errors(ends_on_stop(logs, only_when_following=True)), methods=["GET"]),
        Route(f"{p}/wait", api_errors(ends_on_stop(wait)), methods=["GET"]),
        Route(f"{p}/events", api_errors(ends_on_stop(events, only_when_following=True)), methods=["GET"]),
        Route(f"{p}/doctor", api_errors(doctor_route), methods=["GET"]),
        Route(f"{p}/hooks", api_errors(hooks_route), methods=["GET"]),
        Route(f"{p}/daemon/{{action}}", api_errors(daemon_route), methods=["POST"]),
    ]
    if usage is not None:
        routes += usage_routes(usage)
    routes += sweep_routes(supervisor=supervisor, store=store)
    routes += cancel_routes(supervisor=supervisor, store=store)
    if scheduler is not None:
        routes += scheduler_routes(
            supervisor=supervisor, scheduler=scheduler, digest_key=planner.digest_key, source_at=planner.source_at
        )
    return Starlette(routes=routes)
