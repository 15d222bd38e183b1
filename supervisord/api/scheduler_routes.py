"""API routes of the workstation scheduler (see :mod:`supervisord.api.wire`)::

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
                                        "dependents": [{"run": Run, "rerun_of": id}]}

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
from supervisord.scheduler.rerun import SourceAt, failed_dependents, rerun_run
from supervisord.scheduler.update import parse_changes
from supervisord.supervisor import Supervisor

__all__ = ["scheduler_routes"]


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    """The request's JSON object body. Raises UsageError naming ``what``."""
    try:
        body: Any = await request.json()
    except ValueError:
        raise UsageError(f"{what}: the request body is not JSON") from None
    if not isinstance(body, dict):
        raise UsageError(f"{what}: the request body must be a JSON object")
    return body


def scheduler_routes(
    *, supervisor: Supervisor, scheduler: Scheduler, digest_key: bytes, source_at: SourceAt | None = None
) -> list[Route]:
    """The scheduler's routes over a running supervisor and scheduler
    (``source_at``: snapshots another commit, for ``rerun --rev``)."""

    async def queue(request: Request) -> Response:
        return JSONResponse(scheduler.view())

    async def hold(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        changed = await scheduler.hold(run_id)
        doc: dict[str, Any] = {"run": (await supervisor.get(run_id)).to_json()}
        if not changed:
            doc["note"] = f"run {run_id} was already held"
        return JSONResponse(doc)

    async def release(request: Request) -> Response:
        run_id = await supervisor.resolve(request.path_params["ref"])
        changed = await scheduler.release(run_id)
        doc: dict[str, Any] = {"run": (await supervisor.get(run_id)).to_json()}
        if not changed:
            doc["note"] = f"run {run_id} was not held: nothing to release"
        return JSONResponse(doc)

    async def update(request: Request) -> Response:
        body = await _json_object(request, "update")
        refs = body.pop("runs", None)
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
            raise UsageError("update: name at least one run")
        changes = parse_changes(body)
        run_ids = list(dict.fromkeys([await supervisor.resolve(r) for r in refs]))
        updated = await scheduler.update(run_ids, changes)
        runs = [(await supervisor.get(r)).to_json() for r in run_ids]
        return JSONResponse({"runs": runs, "updated": updated})

    async def queue_set(request: Request) -> Response:
        body = await _json_object(request, "queue set")
        if "max_parallel" not in body and not body.get("from_config"):
            raise UsageError("queue set: give --max-parallel N|none|config")
        doc = await scheduler.set_cap(
            request.path_params["name"], body.get("max_parallel"), from_config=bool(body.get("from_config"))
        )
        return JSONResponse(doc)

    async def rerun(request: Request) -> Response:
        try:
            body: Any = await request.json()
        except ValueError:
            raise UsageError("rerun: the request body is not JSON") from None
        if not isinstance(body, dict):
            raise UsageError("rerun: the request body must be a JSON object")
        run_id = await supervisor.resolve(request.path_params["ref"])
        env = body.get("env") or {}
        rev, command = body.get("rev"), body.get("command")
        if rev is not None and (not isinstance(rev, str) or not rev.strip()):
            raise UsageError("--rev: give a commit, branch or tag")
        if command is not None and not isinstance(command, str):
            raise UsageError("rerun: command must be a string")
        hold, force = bool(body.get("hold")), bool(body.get("force"))
        shell_env = body.get("shell_env")
        dependents = await failed_dependents(supervisor.store, run_id) if body.get("with_dependents") else []
        run, missing = await rerun_run(
            supervisor,
            scheduler,
            digest_key,
            run_id,
            env,
            hold=hold,
            force=force,
            rev=rev,
            command=command,
            source_at=source_at,
            shell_env=shell_env,
        )
        renamed = {run_id: run.id}
        again = []
        for old_id, _ in dependents:
            dep, _missing = await rerun_run(
                supervisor,
                scheduler,
                digest_key,
                old_id,
                env,
                hold=hold,
                force=force,
                renamed=renamed,
                shell_env=shell_env,
            )
            renamed[old_id] = dep.id
            again.append({"run": dep.to_json(), "rerun_of": old_id})
        return JSONResponse(
            {"run": run.to_json(), "rerun_of": run_id, "missing_env": missing, "dependents": again}, status_code=201
        )

    p = API_PREFIX
    return [
        Route(f"{p}/queue", api_errors(queue), methods=["GET"]),
        Route(f"{p}/runs/{{ref}}/hold", api_errors(hold), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/release", api_errors(release), methods=["POST"]),
        Route(f"{p}/runs/{{ref}}/rerun", api_errors(rerun), methods=["POST"]),
        Route(f"{p}/update", api_errors(update), methods=["POST"]),
        Route(f"{p}/queues/{{name}}", api_errors(queue_set), methods=["POST"]),
    ]
