"""API routes of the workstation scheduler (see :mod:`supervisord.shared.wire`)::

    GET  /v1/queue                  {"waiting": [...], "gpus": [...], "queues": [...]}
    POST /v1/runs/{ref}/hold        {"run": Run}
    POST /v1/runs/{ref}/release     {"run": Run}
    POST /v1/queues/{name}          {"max_parallel": int | null, "from_config"?: bool}
                                    -> {"queue": {name, max_parallel, source, running, waiting}, "new": bool}
    POST /v1/update                 {"runs": [ref], "priority"?, "gpus"?, "queue"?, "timeout"?}
                                    -> {"runs": [Run], "updated": {id: {"old", "new"}}}
    POST /v1/runs/{ref}/rerun       {"env": {NAME: value}, "shell_env"?: {NAME: value}, "hold": bool,
                                     "force": bool, "rev"?: str, "command"?: str, "with_dependents"?: bool}
                                    -> {"run": Run, "rerun_of": id, "missing_env": [NAME],
                                        "dependents": [{"run": Run, "rerun_of": id}], "warnings": [str]}

An answer carries ``"warnings": [str]`` too when there are any (a
rerun's always). The queue document is :meth:`supervisord.daemon.scheduler.driver.Scheduler.view`;
every change goes through :class:`supervisord.daemon.commands.Commands`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.daemon.api.boundary import api_errors
from supervisord.daemon.api.state import api_state
from supervisord.daemon.commands import RerunRequest
from supervisord.shared.exceptions import UsageError
from supervisord.shared.wire import API_PREFIX

__all__ = ["SCHEDULER_ROUTES"]


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    """The request's JSON object body. Raises UsageError naming ``what``."""
    try:
        body: Any = await request.json()
    except ValueError:
        raise UsageError(f"{what}: the request body is not JSON") from None
    if not isinstance(body, dict):
        raise UsageError(f"{what}: the request body must be a JSON object")
    return body


async def queue(request: Request) -> Response:
    """``GET /v1/queue``: the scheduler's view."""
    view = api_state(request).queue
    if view is None:
        raise UsageError("this daemon has no scheduler")
    return JSONResponse(view())


async def hold(request: Request) -> Response:
    """``POST /v1/runs/{ref}/hold``."""
    commands = api_state(request).commands
    run_id = await commands.resolve(request.path_params["ref"])
    return JSONResponse((await commands.hold(run_id)).to_json())


async def release(request: Request) -> Response:
    """``POST /v1/runs/{ref}/release``."""
    commands = api_state(request).commands
    run_id = await commands.resolve(request.path_params["ref"])
    return JSONResponse((await commands.release(run_id)).to_json())


async def update(request: Request) -> Response:
    """``POST /v1/update``."""
    body = await _json_object(request, "update")
    refs = body.pop("runs", None)
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
        raise UsageError("update: name at least one run")
    return JSONResponse((await api_state(request).commands.update(refs, body)).to_json())


async def queue_set(request: Request) -> Response:
    """``POST /v1/queues/{name}``."""
    body = await _json_object(request, "queue set")
    return JSONResponse(await api_state(request).commands.set_cap(request.path_params["name"], body))


async def rerun(request: Request) -> Response:
    """``POST /v1/runs/{ref}/rerun``."""
    try:
        body: Any = await request.json()
    except ValueError:
        raise UsageError("rerun: the request body is not JSON") from None
    if not isinstance(body, dict):
        raise UsageError("rerun: the request body must be a JSON object")
    commands = api_state(request).commands
    run_id = await commands.resolve(request.path_params["ref"])
    result = await commands.rerun(run_id, RerunRequest.from_json(body))
    return JSONResponse(result.to_json(), status_code=201)


_P = API_PREFIX

#: Served when the daemon has a scheduler.
SCHEDULER_ROUTES = [
    Route(f"{_P}/queue", api_errors(queue), methods=["GET"]),
    Route(f"{_P}/runs/{{ref}}/hold", api_errors(hold), methods=["POST"]),
    Route(f"{_P}/runs/{{ref}}/release", api_errors(release), methods=["POST"]),
    Route(f"{_P}/runs/{{ref}}/rerun", api_errors(rerun), methods=["POST"]),
    Route(f"{_P}/update", api_errors(update), methods=["POST"]),
    Route(f"{_P}/queues/{{name}}", api_errors(queue_set), methods=["POST"]),
]
