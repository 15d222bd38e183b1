"""The MCP server (``jobsup mcp``): jobsup's commands as MCP tools, over the
daemon API like the CLI (:func:`serve`, loaded on first use)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["serve"]

if TYPE_CHECKING:
    from supervisord.client.mcp.server import serve


def __getattr__(attr: str) -> Any:
    if attr == "serve":
        return importlib.import_module("supervisord.client.mcp.server").serve
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
