"""What the API's endpoints work with, kept on ``app.state.jobsup``.

The endpoints (:mod:`supervisord.daemon.api.server`,
:mod:`supervisord.daemon.api.scheduler_routes`, :mod:`supervisord.daemon.api.sweep_routes`,
:mod:`supervisord.daemon.api.usage_routes`) are module-level functions of the
request: they read with :class:`~supervisord.daemon.readside.ReadSide`, change
runs with :class:`~supervisord.daemon.commands.Commands`, and reach the rest of
the daemon (doctor, hooks, the page, retention, daemon control) through
the callables here. None of them holds the store or the supervisor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

from supervisord.daemon.api.streams import StreamCloser
from supervisord.daemon.api.uvicorn_server import PEER_SCOPE_KEY
from supervisord.daemon.commands import Commands
from supervisord.daemon.readside import ReadSide
from supervisord.daemon.retention import Retention

__all__ = ["ApiState", "api_state", "peer"]

Json = dict[str, Any]


@dataclasses.dataclass
class ApiState:
    """The daemon's services as the API sees them.

    ``doctor`` answers ``GET /v1/doctor``; ``supervised`` counts the runs
    the daemon supervises (``/v1/health``); ``hooks`` lists the hooks with
    their checkpoints and ``config_changed`` the config files changed since
    the daemon read them (``GET /v1/hooks``); ``retention`` answers ``POST
    /v1/prune``; ``ui`` ``POST /v1/ui``; ``daemon_control`` ``POST
    /v1/daemon/{stop|reload}``; ``usage`` ``GET /v1/top``; ``queue`` the
    scheduler's view (``GET /v1/queue``). ``streams`` ends the open streams
    cleanly when the daemon stops."""

    commands: Commands
    reads: ReadSide
    info: Json
    doctor: Callable[[], Awaitable[list[Json]]]
    supervised: Callable[[], int]
    queue: Callable[[], Json] | None = None
    ui: Callable[[Json], Awaitable[Json]] | None = None
    hooks: Callable[[], Awaitable[list[Json]]] | None = None
    retention: Retention | None = None
    streams: StreamCloser | None = None
    config_changed: Callable[[], list[str]] | None = None
    daemon_control: Callable[[str, Json], Awaitable[Json]] | None = None
    usage: Callable[[], Awaitable[Json]] | None = None


def api_state(request: Request) -> ApiState:
    """The :class:`ApiState` of the application serving ``request``."""
    state: ApiState = request.app.state.jobsup
    return state


def peer(request: Request) -> dict[str, int]:
    """The requesting process's ``{"uid", "pid"}`` ({} when not over the Unix socket)."""
    return dict(request.scope.get(PEER_SCOPE_KEY) or {})
