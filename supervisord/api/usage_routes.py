"""API route of the usage sampler (see :mod:`supervisord.api.wire`)::

    GET  /v1/top        {"at", "interval_s", "runs": [...], "gpus": [...], "notes": [...]}

The document is :meth:`supervisord.usage.sampler.UsageSampler.snapshot`
(schema ``top``): what ``jobsup top`` shows.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.api.boundary import api_errors
from supervisord.api.state import api_state
from supervisord.api.wire import API_PREFIX
from supervisord.exceptions import UsageError

__all__ = ["USAGE_ROUTES"]


async def top(request: Request) -> Response:
    """``GET /v1/top``: the sampler's live view."""
    usage = api_state(request).usage
    if usage is None:
        raise UsageError("this daemon does not sample usage")
    return JSONResponse(await usage())


#: Served when the daemon samples usage.
USAGE_ROUTES = [Route(f"{API_PREFIX}/top", api_errors(top), methods=["GET"])]
