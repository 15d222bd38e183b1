"""The client side: the ``jobsup`` command line (:mod:`.cli`), the MCP
server (:mod:`.mcp`) and the daemon API's client (:class:`Client`, :mod:`.api`
over :mod:`.transport`). It imports nothing of :mod:`supervisord.daemon` (an
import-linter independence contract); what both sides need is in
:mod:`supervisord.shared`. Importing it imports nothing more (``Client``
loads on first use)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Client"]

if TYPE_CHECKING:
    from supervisord.client.api import Client


def __getattr__(attr: str) -> Any:
    if attr == "Client":
        return importlib.import_module("supervisord.client.api").Client
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
