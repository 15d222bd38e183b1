"""API route of the usage sampler (see :mod:`supervisord.shared.wire`)::

    GET  /v1/top        {"at", "interval_s", "runs": [...], "gpus": [...], "notes": [...]}

The document is :meth:`supervisord.daemon.usage.sampler.UsageSampler.snapshot`
(schema ``top``): what ``jobsup top`` shows.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.daemon.api.boundary import api_errors
from supervisord.daemon.api.state import api_state
from supervisord.shared.exceptions import UsageError
from supervisord.shared.wire import API_PREFIX

__all__ = ["USAGE_ROUTES"]


async def top(request: Request) -> Response:
    """``GET /v1/top``: the sampler's live view."""
    usage = api_state(request).usage
    if usage is None:
        raise UsageError("this daemon does not sample usage")
    return JSONResponse(await usage())


#: Served when the daemon samples usage.
USAGE_ROUTES = [Route(f"{API_PREFIX}/top", api_errors(top), methods=["GET"])]
