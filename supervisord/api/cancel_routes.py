"""``POST /v1/cancel``: cancel many runs in one request.

    POST /v1/cancel    {"runs": [ref]} -> {"runs": [Run]}

A ref is a run id, a unique prefix of one, or a sweep id (all of its runs).
Every ref is resolved first, in as few reads as it takes (full run ids in
one query): refs that name no run (or several) are all named in one
UsageError ending ``nothing was done``, and nothing is canceled. Then
:meth:`~supervisord.supervisor.Supervisor.cancel_many` cancels them
together; the answer holds each run once, in the order the refs named them.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from store import EventStore
from supervisord.api.boundary import api_errors
from supervisord.api.uvicorn_server import PEER_SCOPE_KEY
from supervisord.api.wire import API_PREFIX
from supervisord.exceptions import AmbiguousRunError, RunNotFoundError, UsageError
from supervisord.readside import resolve_run_id
from supervisord.runref import RUN_ID_LENGTH, is_run_ref, normalize_run_ref
from supervisord.supervisor import Supervisor
from supervisord.sweep import is_sweep_ref
from supervisord.sweepread import resolve_sweep_id

__all__ = ["cancel_routes", "resolve_many"]


async def resolve_many(store: EventStore, refs: list[str]) -> list[str]:
    """Full run ids for ``refs`` (see the module docstring), in order
    without duplicates. Raises UsageError naming every ref that could not
    be resolved (``nothing was done`` when several refs were given)."""
    full = [normalize_run_ref(r) for r in refs if not is_sweep_ref(r) and is_run_ref(normalize_run_ref(r))]
    known = await store.get_runs([r for r in full if len(r) == RUN_ID_LENGTH]) if full else {}
    out: dict[str, None] = {}
    bad: list[str] = []
    for ref in refs:
        try:
            if is_sweep_ref(ref):
                sweep_id = await resolve_sweep_id(store, ref)
                for run in await store.sweep_runs(sweep_id):
                    out.setdefault(run.id, None)
            elif normalize_run_ref(ref) in known:
                out.setdefault(normalize_run_ref(ref), None)
            else:
                out.setdefault(await resolve_run_id(store, ref), None)
        except (RunNotFoundError, AmbiguousRunError, UsageError) as err:
            bad.append(str(err))
    if bad:
        raise UsageError("; ".join(dict.fromkeys(bad)) + ("" if len(refs) == 1 else "; nothing was done"))
    return list(out)


def cancel_routes(*, supervisor: Supervisor, store: EventStore) -> list[Route]:
    """The ``POST /v1/cancel`` route."""

    async def cancel(request: Request) -> Response:
        try:
            body: Any = await request.json()
        except ValueError:
            raise UsageError("cancel: the request body is not JSON") from None
        refs = body.get("runs") if isinstance(body, dict) else None
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
            raise UsageError('cancel: the request body must be {"runs": [RUN, ...]} naming at least one run')
        run_ids = await resolve_many(store, refs)
        peer = dict(request.scope.get(PEER_SCOPE_KEY) or {})
        runs = await supervisor.cancel_many(run_ids, requested_by=peer)
        return JSONResponse({"runs": [r.to_json() for r in runs]})

    return [Route(f"{API_PREFIX}/cancel", api_errors(cancel), methods=["POST"])]
