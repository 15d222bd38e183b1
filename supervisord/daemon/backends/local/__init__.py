"""The local backend: runs as detached process groups on this machine.

``LocalBackend`` is imported on first use (PEP 562 module ``__getattr__``),
so importing this package stays cheap. Each run's detached runner does not
import the package at all: it starts as an isolated interpreter (``python -I
-S``) importing only ``runner.py`` from this folder, and only the standard
library (see :mod:`supervisord.daemon.backends.local.runner`; ~2.9 MB private memory
per idle runner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisord.daemon.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from supervisord.daemon.backends.local.backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
