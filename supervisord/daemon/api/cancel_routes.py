"""``POST /v1/cancel``: cancel many runs in one request.

    POST /v1/cancel    {"runs": [ref]} -> {"runs": [Run]}

A ref is a run id, a unique prefix of one, or a sweep id (all of its runs).
Every ref is resolved first: refs that name no run (or several) are all
named in one UsageError ending ``nothing was done``, and nothing is
canceled. Then the runs are canceled together
(:meth:`~supervisord.daemon.commands.Commands.cancel_many`); the answer holds each
run once, in the order the refs named them.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.daemon.api.boundary import api_errors
from supervisord.daemon.api.state import api_state, peer
from supervisord.shared.exceptions import UsageError
from supervisord.shared.wire import API_PREFIX

__all__ = ["CANCEL_ROUTES"]


async def cancel_many(request: Request) -> Response:
    """``POST /v1/cancel``."""
    try:
        body: Any = await request.json()
    except ValueError:
        raise UsageError("cancel: the request body is not JSON") from None
    refs = body.get("runs") if isinstance(body, dict) else None
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
        raise UsageError('cancel: the request body must be {"runs": [RUN, ...]} naming at least one run')
    result = await api_state(request).commands.cancel_many(refs, peer(request))
    return JSONResponse(result.to_json())


#: The many-runs cancel route.
CANCEL_ROUTES = [Route(f"{API_PREFIX}/cancel", api_errors(cancel_many), methods=["POST"])]
