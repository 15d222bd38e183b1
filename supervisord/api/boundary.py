"""The socket API's error boundary, shared by every route (the core routes
in :mod:`supervisord.api.server`, the scheduler's in
:mod:`supervisord.api.scheduler_routes`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from supervisord.api.wire import to_wire
from supervisord.exceptions import JobsupError, StorageError, map_store_errors

__all__ = ["Handler", "api_errors"]

log = structlog.get_logger("jobsup.api")

Handler = Callable[[Request], Awaitable[Response]]


def api_errors(fn: Handler) -> Handler:
    """``fn`` behind the API boundary: a JobsupError becomes its wire error
    (:func:`supervisord.api.wire.to_wire`); a store error becomes a
    StorageError first (:func:`map_store_errors`, HTTP 503; log text
    deleted by retention becomes a LogsDeletedError, HTTP 410, and a damaged
    log archive a LogsDamagedError, HTTP 500); anything else
    is logged with its traceback and answered as an InternalError (500)."""

    async def wrapped(request: Request) -> Response:
        try:
            with map_store_errors("the jobsup daemon's event store failed"):
                return await fn(request)
        except JobsupError as err:
            if isinstance(err, StorageError):
                log.warning("store error", path=request.url.path, error=str(err))
            status, body = to_wire(err)
            return JSONResponse(body, status_code=status)
        except Exception as err:
            log.exception("request failed", path=request.url.path)
            status, body = to_wire(err)
            return JSONResponse(body, status_code=status)

    return wrapped
