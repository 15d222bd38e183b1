"""The daemon API: wire types, the server (daemon side) and the client (CLI side)."""

from __future__ import annotations

from supervisord.shared.wire import API_PREFIX, WAIT_EXIT_CODES

__all__ = ["API_PREFIX", "WAIT_EXIT_CODES"]
