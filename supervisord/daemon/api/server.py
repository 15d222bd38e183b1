"""The daemon's HTTP API (starlette), served on the Unix socket by uvicorn.

Routes and shapes are documented in :mod:`supervisord.shared.wire`. The
endpoints are module-level functions of the request over
:class:`~supervisord.daemon.api.state.ApiState` (``app.state.jobsup``): reads
through :class:`~supervisord.daemon.readside.ReadSide`, writes through
:class:`~supervisord.daemon.commands.Commands`. :func:`create_app` only assembles
them. Only the
daemon's own user may connect:
:class:`supervisord.daemon.api.uvicorn_server.PeerCredProtocol` checks
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
from supervisord.daemon.api.boundary import Handler, api_errors
from supervisord.daemon.api.cancel_routes import CANCEL_ROUTES
from supervisord.daemon.api.logs_route import logs_response
from supervisord.daemon.api.query import flag_param, float_param, int_param
from supervisord.daemon.api.scheduler_routes import SCHEDULER_ROUTES
from supervisord.daemon.api.state import ApiState, api_state, peer
from supervisord.daemon.api.streams import StreamCloser
from supervisord.daemon.api.sweep_routes import SWEEP_ROUTES, label_params
from supervisord.daemon.api.usage_routes import USAGE_ROUTES
from supervisord.daemon.commands import Commands, is_sweep_request
from supervisord.daemon.health import output_space
from supervisord.daemon.readside import OutputSpace, ReadSide
from supervisord.daemon.retention import Retention, parse_age
from supervisord.daemon.scheduler.driver import Scheduler
from supervisord.daemon.submit import Planner, SubmitRequest
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.exceptions import UsageError
from supervisord.shared.wire import API_PREFIX

__all__ = ["ROUTES", "create_app"]

log = structlog.get_logger("jobsup.api")

_NDJSON = "application/x-ndjson"


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


def _ends_on_stop(handler: Handler, *, only_when_following: bool = False) -> Handler:
    """``handler``'s stream ends cleanly when the daemon stops: only a
    stream that waits for what comes next (``wait``, ``follow=1``), whose
    client reconnects and resumes. A finite replay (``logs`` or ``events``
    without ``follow``) is not cut cleanly: its client could not tell a cut
    from the end and would take the output as complete. It gets the stop's
    grace to finish, and is cut off (an incomplete response, an error to the
    client) only after it."""

    async def guarded(request: Request) -> Response:
        response = await handler(request)
        if only_when_following and not flag_param(request.query_params, "follow"):
            return response
        streams = api_state(request).streams
        if streams is not None and isinstance(response, StreamingResponse):
            response.body_iterator = streams.guard(response.body_iterator)
        return response

    return guarded


async def _json_body(request: Request, what: str) -> Any:
    """The request's JSON body. Raises UsageError naming ``what``."""
    try:
        return await request.json()
    except ValueError:
        raise UsageError(f"{what}: the request body is not JSON") from None


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    """The request's JSON object body. Raises UsageError naming ``what``."""
    body = await _json_body(request, what)
    if not isinstance(body, dict):
        raise UsageError(f"{what}: the request body must be a JSON object")
    return body


async def health(request: Request) -> Response:
    """``GET /v1/health``: the daemon's facts, runs it supervises, storage and output problems."""
    st = api_state(request)
    return JSONResponse(
        {
            "ok": True,
            **st.info,
            "supervised": st.supervised(),
            "storage": st.reads.storage(),
            "output": await st.reads.output(),
        }
    )


async def submit(request: Request) -> Response:
    """``POST /v1/runs``: one run, or a sweep when the task has ``sweep``."""
    body = await _json_body(request, "submit")
    req = SubmitRequest.from_json(body)
    commands = api_state(request).commands
    if is_sweep_request(body):
        return JSONResponse((await commands.submit_sweep(req, peer(request))).to_json(), status_code=201)
    result = await commands.submit(req, peer(request))
    return JSONResponse({**result.to_json(), "warnings": result.warnings}, status_code=201)


async def list_runs(request: Request) -> Response:
    """``GET /v1/runs``: the runs asked for, with storage and output problems."""
    reads = api_state(request).reads
    runs = await reads.list_runs(
        all=flag_param(request.query_params, "all"),
        project=request.query_params.get("project"),
        phase=request.query_params.get("phase"),
        labels=label_params(request.query_params.getlist("label")),
        name=request.query_params.get("name") or None,
        sweep=request.query_params.get("sweep") or None,
    )
    return JSONResponse(
        {"runs": [r.to_json() for r in runs], "storage": reads.storage(), "output": await reads.output()}
    )


async def show(request: Request) -> Response:
    """``GET /v1/runs/{ref}``."""
    return JSONResponse(await api_state(request).reads.show(request.path_params["ref"]))


async def cancel(request: Request) -> Response:
    """``POST /v1/runs/{ref}/cancel``: ``{"run": Run, "warnings": []}``."""
    commands = api_state(request).commands
    run_id = await commands.resolve(request.path_params["ref"])
    return JSONResponse((await commands.cancel(run_id, peer(request))).to_json())


async def pause(request: Request) -> Response:
    """``POST /v1/runs/{ref}/pause``."""
    commands = api_state(request).commands
    run_id = await commands.resolve(request.path_params["ref"])
    return JSONResponse((await commands.pause(run_id, peer(request))).to_json())


async def resume(request: Request) -> Response:
    """``POST /v1/runs/{ref}/resume``."""
    commands = api_state(request).commands
    run_id = await commands.resolve(request.path_params["ref"])
    return JSONResponse((await commands.resume(run_id, peer(request))).to_json())


async def logs(request: Request) -> Response:
    """``GET /v1/runs/{ref}/logs`` (:mod:`supervisord.daemon.api.logs_route`)."""
    return await logs_response(request, api_state(request).reads)


async def wait(request: Request) -> Response:
    """``GET /v1/wait``: NDJSON until the runs meet the condition."""
    stream = await api_state(request).reads.open_wait(
        [r for r in request.query_params.getlist("run") if r],
        cond=request.query_params.get("for") or "terminal",
        after=int_param(request.query_params, "after"),
        timeout=float_param(request.query_params, "timeout"),
    )
    return StreamingResponse(_ndjson(stream), media_type=_NDJSON)


async def events(request: Request) -> Response:
    """``GET /v1/events``: NDJSON of recorded events (and new ones with ``follow``)."""
    reads = api_state(request).reads
    ref = request.query_params.get("run")
    pages = reads.events(
        run_id=await reads.resolve(ref) if ref else None,
        after=int_param(request.query_params, "after", 0) or 0,
        follow=flag_param(request.query_params, "follow"),
        limit=int_param(request.query_params, "limit", 1000, minimum=1) or 1000,
    )
    return StreamingResponse(_ndjson_pages(pages), media_type=_NDJSON)


async def doctor(request: Request) -> Response:
    """``GET /v1/doctor``."""
    return JSONResponse({"checks": await api_state(request).doctor()})


async def hooks(request: Request) -> Response:
    """``GET /v1/hooks``: the hooks and the config files changed since the daemon read them."""
    st = api_state(request)
    return JSONResponse(
        {
            "hooks": await st.hooks() if st.hooks is not None else [],
            "config_changed": st.config_changed() if st.config_changed is not None else [],
        }
    )


async def daemon(request: Request) -> Response:
    """``POST /v1/daemon/{stop|reload}``."""
    control = api_state(request).daemon_control
    if control is None:
        raise UsageError("this daemon cannot be controlled over the API")
    try:
        body: Any = await request.json()
    except ValueError:
        body = {}
    return JSONResponse(await control(request.path_params["action"], body if isinstance(body, dict) else {}))


async def ui(request: Request) -> Response:
    """``POST /v1/ui``: enable or stop the web page."""
    page = api_state(request).ui
    if page is None:
        raise UsageError("this daemon does not serve the web page")
    return JSONResponse(await page(await _json_object(request, "ui")))


async def prune(request: Request) -> Response:
    """``POST /v1/prune``."""
    retention = api_state(request).retention
    if retention is None:
        raise UsageError("this daemon does not prune")
    body = await _json_object(request, "prune")
    older = parse_age(str(body.get("older_than", "")), what="--older-than", allow_zero=True)
    report = await retention.prune(
        older_than_s=older,
        run_dirs_older_than_s=older if body.get("run_dirs") else None,
        dry_run=bool(body.get("dry_run")),
        delete_archives=bool(body.get("delete_archives")),
    )
    return JSONResponse(report)


async def outputs(request: Request) -> Response:
    """``GET /v1/runs/{ref}/outputs``."""
    reads = api_state(request).reads
    return JSONResponse(await reads.outputs(await reads.resolve(request.path_params["ref"])))


async def which_route(request: Request) -> Response:
    """``POST /v1/which`` ``{"sha256": [HEX, ...]}``."""
    body = await _json_body(request, "which")
    digests = body.get("sha256") if isinstance(body, dict) else None
    if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
        raise UsageError('which: the request body must be {"sha256": [HEX, ...]}')
    return JSONResponse(await api_state(request).reads.which(digests))


_P = API_PREFIX

#: The core routes (every daemon serves them).
ROUTES = [
    Route(f"{_P}/runs/{{ref}}/outputs", api_errors(outputs), methods=["GET"]),
    Route(f"{_P}/which", api_errors(which_route), methods=["POST"]),
    Route(f"{_P}/prune", api_errors(prune), methods=["POST"]),
    Route(f"{_P}/ui", api_errors(ui), methods=["POST"]),
    Route(f"{_P}/health", api_errors(health), methods=["GET"]),
    Route(f"{_P}/runs", api_errors(submit), methods=["POST"]),
    Route(f"{_P}/runs", api_errors(list_runs), methods=["GET"]),
    Route(f"{_P}/runs/{{ref}}", api_errors(show), methods=["GET"]),
    Route(f"{_P}/runs/{{ref}}/cancel", api_errors(cancel), methods=["POST"]),
    Route(f"{_P}/runs/{{ref}}/pause", api_errors(pause), methods=["POST"]),
    Route(f"{_P}/runs/{{ref}}/resume", api_errors(resume), methods=["POST"]),
    Route(f"{_P}/runs/{{ref}}/logs", api_errors(_ends_on_stop(logs, only_when_following=True)), methods=["GET"]),
    Route(f"{_P}/wait", api_errors(_ends_on_stop(wait)), methods=["GET"]),
    Route(f"{_P}/events", api_errors(_ends_on_stop(events, only_when_following=True)), methods=["GET"]),
    Route(f"{_P}/doctor", api_errors(doctor), methods=["GET"]),
    Route(f"{_P}/hooks", api_errors(hooks), methods=["GET"]),
    Route(f"{_P}/daemon/{{action}}", api_errors(daemon), methods=["POST"]),
    *SWEEP_ROUTES,
    *CANCEL_ROUTES,
]


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
    commands: Commands | None = None,
    reads: ReadSide | None = None,
) -> Starlette:
    """The API application: the module's routes (and the scheduler's when
    there is one, ``GET /v1/top`` when ``usage`` is given) over an
    :class:`~supervisord.daemon.api.state.ApiState` (its fields document the
    callables) on ``app.state.jobsup``. Writes go through ``commands``
    (default: a :class:`~supervisord.daemon.commands.Commands` over ``supervisor``,
    ``planner`` and ``scheduler``), reads through ``reads`` (default: a
    :class:`~supervisord.daemon.readside.ReadSide` over ``store``)."""
    if commands is None:
        commands = Commands(supervisor, planner, scheduler)
    if reads is None:
        reads = ReadSide(store, output=_output_space(supervisor))
    routes = list(ROUTES)
    if usage is not None:
        routes += USAGE_ROUTES
    if scheduler is not None:
        routes += SCHEDULER_ROUTES
    app = Starlette(routes=routes)
    app.state.jobsup = ApiState(
        commands=commands,
        reads=reads,
        info=info,
        doctor=doctor,
        supervised=supervisor.supervised if supervisor is not None else _none_supervised,
        queue=scheduler.view if scheduler is not None else None,
        ui=ui,
        hooks=hooks,
        retention=retention,
        streams=streams,
        config_changed=config_changed,
        daemon_control=daemon_control,
        usage=usage,
    )
    return app


def _none_supervised() -> int:
    return 0


def _output_space(supervisor: Supervisor) -> OutputSpace:
    """The supervisor's local runs' output disk problem (:func:`supervisord.daemon.health.output_space`)."""

    async def output() -> dict[str, Any] | None:
        running = supervisor.running_local()
        if not running:
            return None
        return await anyio.to_thread.run_sync(output_space, supervisor.paths.runs_dir, running)

    return output
