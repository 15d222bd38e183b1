"""The socket API's error boundary, shared by every route (the core routes
in :mod:`supervisord.daemon.api.server`, the scheduler's in
:mod:`supervisord.daemon.api.scheduler_routes`).

An error before a response starts is the response: its status and the
wire error body (:func:`supervisord.shared.wire.to_wire`). An error in a
stream, after its status and headers went out, cannot change them: an
NDJSON stream (``logs`` as ``ndjson``/``blocks``, ``events``, ``wait``)
then ends cleanly with one last line, the error record
``{"error": {...}, "status": N}`` (:data:`~supervisord.shared.wire.ERROR_RECORD_KEY`),
which the client raises as that error. A plain-text stream (``logs``
as ``text``) has no room for a record: it is cut off (no last chunk),
and the client asks again where it was cut
(:meth:`supervisord.client.api.Client.logs_text`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable

import anyio
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from store.errors import StoreClosedError
from supervisord.shared.exceptions import DaemonStoppingError, JobsupError, StorageError, map_store_errors
from supervisord.shared.wire import error_record, to_wire

__all__ = ["Handler", "api_errors"]

log = structlog.get_logger("jobsup.api")

Handler = Callable[[Request], Awaitable[Response]]

_STORE_FAILED = "the jobsup daemon's event store failed"
_NDJSON = "application/x-ndjson"


def api_errors(fn: Handler) -> Handler:
    """``fn`` behind the API boundary: a JobsupError becomes its wire error
    (:func:`supervisord.shared.wire.to_wire`); a store error becomes a
    StorageError first (:func:`map_store_errors`, HTTP 503; log text
    deleted by retention becomes a LogsDeletedError, HTTP 410, and a damaged
    log archive a LogsDamagedError, HTTP 500); anything else
    is logged with its traceback and answered as an InternalError (500).
    The same holds inside an NDJSON stream, whose error ends it as an
    error record (module docstring)."""

    async def wrapped(request: Request) -> Response:
        try:
            with map_store_errors(_STORE_FAILED):
                response = await fn(request)
        except JobsupError as err:
            if isinstance(err, StorageError):
                log.warning("store error", path=request.url.path, error=str(err))
            status, body = to_wire(err)
            return JSONResponse(body, status_code=status)
        except Exception as err:
            log.exception("request failed", path=request.url.path)
            status, body = to_wire(err)
            return JSONResponse(body, status_code=status)
        if isinstance(response, StreamingResponse) and (response.media_type or "").startswith(_NDJSON):
            response.body_iterator = _ends_with_error_record(response.body_iterator, request.url.path)
        return response

    return wrapped


async def _ends_with_error_record(body: AsyncIterable[str | bytes | memoryview], path: str) -> AsyncIterator[bytes]:
    """The chunks of ``body``; when it raises, one last NDJSON line with the
    error record instead (store errors mapped as before a response), and
    the end of the stream."""
    items = aiter(body)
    try:
        try:
            with map_store_errors(_STORE_FAILED):
                async for chunk in items:
                    yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        except JobsupError as err:
            if isinstance(err.__cause__, StoreClosedError):
                # The daemon is stopping (its store closed under this
                # stream): the client reconnects to the next daemon, as
                # when the stream is cut, instead of ending on the error.
                log.info("stream ended: the daemon is stopping", path=path)
                err = DaemonStoppingError(f"the daemon is stopping: {err}")
            else:
                log.warning("stream failed", path=path, error=str(err), error_type=type(err).__name__)
            record = error_record(err)
        except Exception as err:
            log.exception("stream failed", path=path)
            record = error_record(err)
        else:
            return
        yield (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()
