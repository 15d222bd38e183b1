"""Backends: one kind of compute each, all behind :class:`Backend`."""

from __future__ import annotations

from supervisord.daemon.backends.base import Backend, RunReporter, RunSpec

__all__ = ["Backend", "RunReporter", "RunSpec"]
