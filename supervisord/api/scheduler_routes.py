"""API routes of the workstation scheduler (see :mod:`supervisord.api.wire`)::

    GET  /v1/queue                  {"waiting": [...], "gpus": [...], "queues": [...]}
    POST /v1/runs/{ref}/hold        {"run": Run}
    POST /v1/runs/{ref}/release     {"run": Run}
    POST /v1/runs/{ref}/rerun       {"env": {NAME: value}, "shell_env"?: {NAME: value}, "hold": bool, "force": bool}
                                    -> {"run": Run, "rerun_of": id, "missing_env": [NAME]}

The queue document is :meth:`supervisord.scheduler.driver.Scheduler.view`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.api.boundary import api_errors
from supervisord.api.wire import API_PREFIX
from supervisord.exceptions import UsageError
from supervisord.scheduler.driver import Scheduler
from supervisord.scheduler.rerun import rerun_run
from supervisord.supervisor import Supervisor

__all__ = ["scheduler_routes"]


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
            supervisor,
            scheduler,
            digest_key,
            run_id,
            env,
            hold=bool(body.get("hold")),
            force=bool(body.get("force")),
            shell_env=body.get("shell_env"),
        )
        return JSONResponse({"run": run.to_json(), "rerun_of": run_id, "missing_env": missing}, status_code=201)

    p = API_PREFIX
    return [
        Route(f"{p}/queue", api_errors(queue), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}/hold", api_errors(hold), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/release", api_errors(release), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/rerun", api_errors(rerun), methods=["POST"]),
    ]
