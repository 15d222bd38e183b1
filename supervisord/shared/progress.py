"""Progress reports: what a job says about how far it got, and its metrics.

A local run gets ``JOBSUP_PROGRESS_FILE`` (``<run dir>/progress``); the job
replaces that file's content with one line of text, or a JSON object::

    {"step": 5, "total": 100, "message": "epoch 1", "metrics": {"loss": 0.31}}

A Kubernetes run prints a log line ``JOBSUP_PROGRESS <that JSON>`` instead.
The daemon records what it reads as a ``Progress`` event at most once per
``local.progress_interval_s`` (default :data:`DEFAULT_INTERVAL_S`) and once
more when the run ends, and only when it changed. Only the first
:data:`MAX_READ` bytes are read; text that is not UTF-8 is replaced, control
characters dropped, a JSON object cut short (a write caught halfway) waits
for the next look; nothing a job writes there can fail the run or slow the
daemon (one ``stat`` per interval).

Pure but for :class:`ProgressFile` (a ``stat`` and a 4 KiB read).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = [
    "DEFAULT_INTERVAL_S",
    "LOG_PREFIX",
    "MAX_READ",
    "PROGRESS_FILE",
    "ProgressFile",
    "RateLimit",
    "interval_of",
    "parse_progress",
    "progress_text",
]

#: Seconds between two Progress events of one run, unless configured.
DEFAULT_INTERVAL_S: Final = 10.0
#: Bytes of the progress file that are read.
MAX_READ: Final = 4096
#: The file's name in the run's folder.
PROGRESS_FILE: Final = "progress"
#: A log line starting with this (then the JSON) is a progress report.
LOG_PREFIX: Final = "JOBSUP_PROGRESS "

_MAX_MESSAGE = 500
_MAX_METRICS = 64
_MAX_KEY = 64


def interval_of(config: Mapping[str, Any]) -> float:
    """``local.progress_interval_s`` of a run's effective config (default
    :data:`DEFAULT_INTERVAL_S`)."""
    local = config.get("local") if isinstance(config, Mapping) else None
    value = local.get("progress_interval_s") if isinstance(local, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return DEFAULT_INTERVAL_S


def _clean(text: str, limit: int) -> str:
    return "".join(c for c in text if c.isprintable())[:limit].strip()


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def parse_progress(raw: bytes | str) -> dict[str, Any] | None:
    """The Progress event data for what a job wrote: from a JSON object
    ``step``, ``total`` (numbers), ``message`` (text, cut at 500
    characters) and ``metrics`` (name -> number or short text, at most 64),
    whichever are valid; from anything else its first line as ``message``.
    None when there is nothing to record (empty, or a JSON object that does
    not parse: written halfway, or longer than :data:`MAX_READ`)."""
    if isinstance(raw, bytes):
        raw = raw[:MAX_READ].decode("utf-8", errors="replace")
    text = raw.strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        out: dict[str, Any] = {}
        for key in ("step", "total"):
            value = _number(doc.get(key))
            if value is not None:
                out[key] = value
        message = doc.get("message")
        if isinstance(message, str) and _clean(message, _MAX_MESSAGE):
            out["message"] = _clean(message, _MAX_MESSAGE)
        metrics = doc.get("metrics")
        if isinstance(metrics, dict):
            kept: dict[str, Any] = {}
            for name, value in list(metrics.items())[:_MAX_METRICS]:
                key = _clean(str(name), _MAX_KEY)
                if not key:
                    continue
                number = _number(value)
                if number is not None:
                    kept[key] = number
                elif isinstance(value, str):
                    kept[key] = _clean(value, _MAX_KEY)
            if kept:
                out["metrics"] = kept
        return out or None
    line = _clean(text.splitlines()[0], _MAX_MESSAGE)
    return {"message": line} if line else None


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def progress_text(progress: Mapping[str, Any] | None, *, max_metrics: int = 3) -> str:
    """A run's progress as a table cell: ``5/100 loss=0.31 acc=0.88``
    (step/total or step, then the first metrics; else the message); ``-``
    for none."""
    if not progress:
        return "-"
    parts: list[str] = []
    step, total = progress.get("step"), progress.get("total")
    if step is not None:
        parts.append(f"{_short(step)}/{_short(total)}" if total is not None else _short(step))
    metrics = progress.get("metrics")
    if isinstance(metrics, Mapping):
        parts += [f"{k}={_short(v)}" for k, v in list(metrics.items())[:max_metrics]]
    if not parts and progress.get("message"):
        parts.append(str(progress["message"])[:60])
    return " ".join(parts) or "-"


class RateLimit:
    """Holds a run's progress reports to at most one per ``interval_s``:
    :meth:`offer` the newest report at any rate; :meth:`take` returns the
    one to record now (changed since the last recorded, and the interval
    passed), :meth:`final` the one to record at the end (changed)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._newest: dict[str, Any] | None = None
        self._recorded: dict[str, Any] | None = None
        self._recorded_at: float | None = None

    def offer(self, data: dict[str, Any] | None) -> None:
        """Keep ``data`` as the newest report (None: nothing new)."""
        if data is not None:
            self._newest = data

    def due(self, now: float) -> bool:
        """Whether a report could be recorded at ``now`` (monotonic seconds)."""
        return self._recorded_at is None or now - self._recorded_at >= self.interval_s

    def take(self, now: float) -> dict[str, Any] | None:
        """The report to record at ``now`` (then counted as recorded), or None."""
        if self._newest is None or self._newest == self._recorded or not self.due(now):
            return None
        self._recorded, self._recorded_at = self._newest, now
        return self._newest

    def final(self) -> dict[str, Any] | None:
        """The newest report if it was not recorded (then it is), else None."""
        if self._newest is None or self._newest == self._recorded:
            return None
        self._recorded = self._newest
        return self._newest


class ProgressFile:
    """Watches one run's progress file: :meth:`poll` looks at it (a
    ``stat``, and a read of :data:`MAX_READ` bytes when it changed) at
    most once per interval and returns the report to record, or None."""

    def __init__(self, path: Path, interval_s: float) -> None:
        self.path = path
        self.limit = RateLimit(interval_s)
        self._seen: tuple[int, int, int] | None = None
        self._looked_at: float | None = None

    def _read(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if key == self._seen:
                return
            data = os.read(fd, MAX_READ)
        except OSError:
            return
        finally:
            os.close(fd)
        parsed = parse_progress(data)
        if parsed is not None:  # a write caught halfway is read again next time
            self._seen = key
        self.limit.offer(parsed)

    @property
    def in_use(self) -> bool:
        """Whether the job has written a report (the file was read once)."""
        return self._seen is not None

    def poll(self, now: float) -> dict[str, Any] | None:
        """The report to record at ``now`` (monotonic seconds), or None."""
        if self._looked_at is not None and now - self._looked_at < self.limit.interval_s:
            return None
        if not self.limit.due(now):
            return None
        self._looked_at = now
        self._read()
        return self.limit.take(now)

    def final(self) -> dict[str, Any] | None:
        """At the run's end: the last report if it was not recorded yet."""
        self._read()
        return self.limit.final()
