"""API of sweeps (see :mod:`supervisord.api.wire`)::

    POST /v1/runs  with task.sweep     -> 201 {"sweep": Sweep, "run_ids": [id], "warnings": [str]}
    GET  /v1/sweeps/{ref}[?runs=1]     the sweep document (supervisord.sweepread)
    POST /v1/sweeps/{ref}/cancel       {"runs": [Run]}: every run of the sweep canceled

A sweep is submitted in one request and recorded in one transaction
(``SweepSubmitted``, then each run's ``Submitted``): see
:meth:`supervisord.submit.Planner.plan_sweep` and
:meth:`supervisord.supervisor.Supervisor.submit_sweep`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from store import EventStore
from supervisord.api.boundary import api_errors
from supervisord.api.query import flag_param
from supervisord.api.wire import API_PREFIX
from supervisord.exceptions import UsageError
from supervisord.scheduler.driver import Scheduler
from supervisord.submit import Planner, SubmitRequest
from supervisord.supervisor import Supervisor
from supervisord.sweepread import resolve_sweep_id, sweep_document

__all__ = ["is_sweep_request", "label_params", "submit_sweep", "sweep_routes"]


def label_params(values: list[str]) -> dict[str, str]:
    """The ``label=K=V`` query parameters of ``GET /v1/runs`` as a mapping.
    Raises UsageError naming a malformed one."""
    labels: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise UsageError(f"query parameter label={value[:40]!r} must be KEY=VALUE")
        labels[key] = val
    return labels


def is_sweep_request(body: Any) -> bool:
    """Whether a ``POST /v1/runs`` body submits a sweep (its task has ``sweep``)."""
    return isinstance(body, dict) and isinstance(body.get("task"), dict) and body["task"].get("sweep") is not None


async def submit_sweep(
    req: SubmitRequest,
    peer: Mapping[str, int],
    *,
    planner: Planner,
    supervisor: Supervisor,
    scheduler: Scheduler | None,
) -> Response:
    """Plan, check the scheduling once (the runs share it) and record the sweep."""
    plan = await planner.plan_sweep(req)
    who = {f"submitted_by_{k}": v for k, v in peer.items()}
    first = {**plan.runs[0].submitted, **who}
    prepared = await scheduler.prepare(first) if scheduler is not None else first
    sched = {"scheduling": prepared["scheduling"]} if "scheduling" in prepared else {}
    runs = [({**p.submitted, **who, **sched}, p.env) for p in plan.runs]
    run_ids, warnings = await supervisor.submit_sweep(plan.sweep_id, plan.sweep, runs, config=plan.runs[0].config)
    return JSONResponse(
        {"sweep": {"id": plan.sweep_id, **plan.sweep}, "run_ids": run_ids, "warnings": [*plan.warnings, *warnings]},
        status_code=201,
    )


def sweep_routes(*, supervisor: Supervisor, store: EventStore) -> list[Route]:
    """The sweep read and cancel routes."""

    async def show(request: Request) -> Response:
        doc = await sweep_document(
            store, request.path_params["ref"], with_runs=flag_param(request.query_params, "runs")
        )
        return JSONResponse(doc)

    async def cancel(request: Request) -> Response:
        sweep_id = await resolve_sweep_id(store, request.path_params["ref"])
        runs = await store.sweep_runs(sweep_id)
        peer = dict(request.scope.get("jobsup.peer") or {})
        # All together (queued ones first: they must not start meanwhile).
        done = {r.id: r for r in await supervisor.cancel_many([r.id for r in runs], requested_by=peer)}
        return JSONResponse({"runs": [done[r.id].to_json() for r in runs]})

    p = API_PREFIX
    return [
        Route(f"{p}/sweeps/{{ref}}", api_errors(show), methods=["GET"]),
        Route(f"{p}/sweeps/{{ref}}/cancel", api_errors(cancel), methods=["POST"]),
    ]
