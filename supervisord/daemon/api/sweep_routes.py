"""API of sweeps (see :mod:`supervisord.shared.wire`)::

    POST /v1/runs  with task.sweep     -> 201 {"sweep": Sweep, "run_ids": [id], "warnings": [str]}
    GET  /v1/sweeps/{ref}[?runs=1]     the sweep document (supervisord.daemon.sweepread)
    POST /v1/sweeps/{ref}/cancel       {"runs": [Run]}: every run of the sweep canceled

A sweep is submitted in one request and recorded in one transaction
(``SweepSubmitted``, then each run's ``Submitted``): see
:meth:`supervisord.daemon.commands.Commands.submit_sweep`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from supervisord.daemon.api.boundary import api_errors
from supervisord.daemon.api.query import flag_param
from supervisord.daemon.api.state import api_state, peer
from supervisord.shared.exceptions import UsageError
from supervisord.shared.wire import API_PREFIX

__all__ = ["SWEEP_ROUTES", "label_params"]


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


async def show(request: Request) -> Response:
    """``GET /v1/sweeps/{ref}``."""
    reads = api_state(request).reads
    return JSONResponse(
        await reads.sweep(request.path_params["ref"], with_runs=flag_param(request.query_params, "runs"))
    )


async def cancel(request: Request) -> Response:
    """``POST /v1/sweeps/{ref}/cancel``."""
    result = await api_state(request).commands.cancel_sweep(request.path_params["ref"], peer(request))
    return JSONResponse(result.to_json())


#: The sweep read and cancel routes.
SWEEP_ROUTES = [
    Route(f"{API_PREFIX}/sweeps/{{ref}}", api_errors(show), methods=["GET"]),
    Route(f"{API_PREFIX}/sweeps/{{ref}}/cancel", api_errors(cancel), methods=["POST"]),
]
