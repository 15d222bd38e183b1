"""structlog set-up for the daemon: JSON lines when stderr is not a TTY
(journald, the daemon log file), key=value console output on a TTY."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure_logging"]


def configure_logging(level: str = "info") -> None:
    """Configure structlog (and the stdlib root logger, for libraries) to
    write to stderr at ``level``."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    tty = sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=True) if tty else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
