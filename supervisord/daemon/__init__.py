"""The daemon side: the service (:mod:`.service`, :func:`run_daemon`), the
API server (:mod:`.api`), the command path (:mod:`.commands`), the
supervisor, the scheduler, hooks, the page (:mod:`.ui`), retention, usage
sampling, outputs and the backends. It imports nothing of
:mod:`supervisord.client` (an import-linter independence contract).
Importing it imports nothing more: ``run_daemon`` loads on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["run_daemon"]

if TYPE_CHECKING:
    from supervisord.daemon.service import run_daemon


def __getattr__(attr: str) -> Any:
    if attr == "run_daemon":
        return importlib.import_module("supervisord.daemon.service").run_daemon
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
