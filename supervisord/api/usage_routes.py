"""API route of the usage sampler (see :mod:`supervisord.api.wire`)::

    GET  /v1/top        {"at", "interval_s", "runs": [...], "gpus": [...], "notes": [...]}

The document is :meth:`supervisord.usage.sampler.UsageSampler.snapshot`
(schema ``top``): what ``jobsup top`` shows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.api.boundary import api_errors
from supervisord.api.wire import API_PREFIX

__all__ = ["usage_routes"]


def usage_routes(snapshot: Callable[[], Awaitable[dict[str, Any]]]) -> list[Route]:
    """``GET /v1/top`` answered by ``snapshot`` (the sampler's live view)."""

    async def top(request: Request) -> Response:
        return JSONResponse(await snapshot())

    return [Route(f"{API_PREFIX}/top", api_errors(top), methods=["GET"])]
