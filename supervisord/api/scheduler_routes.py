"""API routes of the workstation scheduler (see :mod:`supervisord.api.wire`)::

    GET  /v1/queue                  {"waiting": [...], "gpus": [...], "queues": [...]}
    POST /v1/runs/{ref}/hold        {"run": Run}
    POST /v1/runs/{ref}/release     {"run": Run}
    POST /v1/runs/{ref}/rerun       {"env": {NAME: value}, "hold": bool, "force": bool}
                                    -> {"run": Run, "rerun_of": id, "missing_env": [NAME]}

The queue document is :meth:`supervisord.scheduler.driver.Scheduler.view`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.api.wire import API_PREFIX, encode_error
from supervisord.exceptions import JobsupError, UsageError
from supervisord.scheduler.driver import Scheduler
from supervisord.scheduler.rerun import rerun_run
from supervisord.supervisor import Supervisor

__all__ = ["scheduler_routes"]

log = structlog.get_logger("jobsup.api")

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


def scheduler_routes(*, supervisor: Supervisor, scheduler: Scheduler, digest_key: bytes) -> list[Route]:
    """The scheduler's routes over a running supervisor and scheduler."""

    async def queue(request: Request) -> Response:
        return JSONResponse(scheduler.view())

    async def hold(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        await scheduler.hold(run_id)
        return JSONResponse({"run": (await supervisor.get(run_id)).to_json()})

    async def release(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        await scheduler.release(run_id)
        return JSONResponse({"run": (await supervisor.get(run_id)).to_json()})

    async def rerun(request: Request) -> Response:
        try:
            body: Any = await request.json()
        except ValueError:
            raise UsageError("rerun: the request body is not JSON") from None
        if not isinstance(body, dict):
            raise UsageError("rerun: the request body must be a JSON object")
        run_id = await supervisor.resolve(request.path_params["ref"])
        env = body.get("env") or {}
        run, missing = await rerun_run(
            supervisor, scheduler, digest_key, run_id, env, hold=bool(body.get("hold")), force=bool(body.get("force"))
        )
        return JSONResponse({"run": run.to_json(), "rerun_of": run_id, "missing_env": missing}, status_code=201)

    p = API_PREFIX
    return [
        Route(f"{p}/queue", _errors(queue), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}/hold", _errors(hold), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/release", _errors(release), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/rerun", _errors(rerun), methods=["POST"]),
    ]
