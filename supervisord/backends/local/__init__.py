"""The local backend: runs as detached process groups on this machine."""

from __future__ import annotations

from supervisord.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
