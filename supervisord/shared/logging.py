"""structlog set-up for the daemon: JSON lines when stderr is not a TTY
(journald, the daemon log file), key=value console output on a TTY.

What libraries log through the standard library (uvicorn's ``uvicorn.error``,
httpx...) goes through the same processors, so the daemon log stays one
JSON object a line: a record's traceback becomes its ``exception`` field,
its logger's name ``logger``."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import TextIO, cast

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
    writer = _DroppingWriter(sys.stderr)
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
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, writer)),
        cache_logger_on_first_use=True,
    )
    # The standard library's records (libraries): the same processors and
    # renderer, the same writer; only the root logger's handler.
    handler = logging.StreamHandler(cast(TextIO, writer))
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.StackInfoRenderer(),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(lvl, logging.WARNING))


class _DroppingWriter:
    """``stream`` for log lines, where a failed write (the daemon log's disk
    is full) drops the line instead of raising into the code that logged:
    a full disk must not stop the daemon. Once writing works again, one line
    says how many were dropped."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.dropped = 0

    def write(self, text: str) -> int:
        try:
            if self.dropped and text.strip():
                self._stream.write(f'{{"event": "log.lines_dropped", "level": "warning", "lines": {self.dropped}}}\n')
                self.dropped = 0
            return self._stream.write(text)
        except OSError:
            if text.strip():
                self.dropped += 1
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()
